"""The whole toy-world study (the quickstart's loop) end to end at a reduced size: every stage runs
for real (MiniLM index, warm start, rejection sampling, fine-tuning through the SFT recipe, the
single-step baseline, evaluation of every method), and an interrupted study resumes."""

from __future__ import annotations

import json

import pytest
import torch

from corag.commands import quickstart, toystudy
from corag.config import load_yaml
from corag.data.formats import load_multihopqa
from corag.errors import InputError
from corag.toy.quickstart import CONFIG, WARM
from corag.toy.study import compute_dtype, judge_headroom
from corag.toy.warmstart import FRESH_SEED_MIN, fresh_seeds
from corag.toy.world import generate_world, question

SMALL = [
    "--num_entities", "60", "--num_distractors", "15", "--train_per_hop", "8", "--test_per_hop", "2",
    "--warm_pretrain_steps", "3", "--warm_reading_steps", "4", "--warm_passage_steps", "2", "--warm_final_steps", "3", "--warm_mixed_steps", "6", "--sample_questions", "4", "--num_chains", "2", "--test_questions", "3", "--diagnose_questions", "6",
    "--sft_epochs", "2", "--dtype", "bfloat16", "--min_score=-1000.0",
    "--evals",
    "no_retrieval=corag@greedy:L=0:docs=0", "single_step=single_step@greedy:L=0",
    "corag_greedy=corag@greedy:L=1", "warm_greedy=warm@greedy:L=1", "corag_best_of_2=corag@best_of_n:L=1:N=2",
    "corag_tree=corag@tree_search:L=1", "ircot=corag@ircot:max_sentences=2",
    "searchain=corag@searchain:max_rounds=1",
]  # fmt: skip


@pytest.mark.slow
def test_quickstart_runs_every_stage_at_a_reduced_size(tmp_path, capsys):
    """From the shipped warm model, as `corag quickstart` runs (the warm start itself, which
    `--from-scratch` adds, is trained by test_warm_only_trains_a_warm_model_to_reuse_...)."""
    made = json.loads((WARM / "warm_start.json").read_text())
    config = load_yaml(CONFIG)
    # The warm model trained on fresh worlds only, whose seeds lie far above any target world's.
    assert config["seed"] < FRESH_SEED_MIN <= min(fresh_seeds(made["study_config"]["warm_seed"], 10_000))
    assert all(0.0 <= v <= 1.0 for v in made["heldout_accuracy"].values())
    out = tmp_path / "qs"
    assert quickstart.main(["--out_dir", str(out), *SMALL]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["timings_s"]) == {
        "world", "index", "sample", "fine-tune", "single-step baseline", "diagnose", "evaluate"
    }  # fmt: skip
    assert summary["config"]["warm_dir"] == str(WARM)
    assert json.loads((out / "index" / "manifest.json").read_text())["kind"] == "dense"
    chains = load_multihopqa(out / "chains.jsonl")  # the sampling output, in the released schema
    assert len(chains) == 4
    for model in ("corag", "single_step"):
        assert (out / "models" / model / "config.json").is_file()
    warm = json.loads((WARM / "config.json").read_text())
    assert (warm["num_attention_heads"], warm["head_dim"], warm["hidden_size"]) == (4, 64, 128)
    assert json.loads((out / "models" / "corag" / "trainer_state.json").read_text())["num_train_epochs"] == 2
    # Rejection at the study's min_score (here below every score: all four chains are trained on).
    built = json.loads((out / "models" / "corag-examples" / "examples.json").read_text())
    assert built["settings"]["min_score"] == -1000.0 and built["tasks"]["final"] == 4
    # bfloat16 on request, on any CPU: autocast in both fine-tunings (weights saved in float32).
    assert summary["dtype"] == "bfloat16"
    for model in ("corag", "single_step"):
        assert torch.load(out / "models" / model / "training_args.bin", weights_only=False).bf16, model
        assert json.loads((out / "models" / model / "config.json").read_text())["dtype"] == "float32"
    # Each call scored alone on unsampled training questions (two per hop count), for both models.
    calls = summary["call_accuracy"]
    assert set(calls) == {"warm", "corag"}
    for model, by_hops in calls.items():
        assert set(by_hops) == {"2hop", "3hop", "4hop"}, model
        for hops, accuracy in by_hops.items():
            keys = {"subquery_first", "subanswer", "final", "gold_passage_top1", "chain_product"}
            assert keys | {"subquery_later"} == set(accuracy), (model, hops)
            assert all(0.0 <= v <= 1.0 for v in accuracy.values()), (model, hops)
            assert accuracy["gold_passage_top1"] >= 0.5  # MiniLM finds a sub-query's own passage
    results = summary["results"]
    assert list(results) == ["no_retrieval", "single_step", "corag_greedy", "warm_greedy", "corag_best_of_2",
                             "corag_tree", "ircot", "searchain"]  # fmt: skip
    assert results["warm_greedy"]["model"] == "warm"
    for label, result in results.items():
        assert result["count"] == 3, label
        assert set(result["em_by_hops"]) == {"2", "3"}, label  # 4 hops need more than L = 3 steps
        assert 0.0 <= result["em"] <= 100.0
        assert result["tokens_per_question"] > 0, label
        lines = (out / "eval" / label / "predictions.jsonl").read_text().splitlines()
        assert len(lines) == 3
    # Best-of-N's judge, counted on its own chains (the only run with penalties).
    assert [label for label, r in results.items() if "judge" in r] == ["corag_best_of_2"]
    for judged in results["corag_best_of_2"]["judge"].values():
        assert judged["greedy"] <= judged["any"] <= judged["questions"]
        assert judged["penalty"] <= judged["any"] and judged["link_check"] <= judged["any"]
    assert sum(j["questions"] for j in results["corag_best_of_2"]["judge"].values()) == 3
    # More search costs more tokens: the chain strategies pay for the retrieval steps they add.
    assert results["corag_tree"]["tokens_per_question"] > results["corag_greedy"]["tokens_per_question"]
    table = (out / "eval" / "results.md").read_text()
    assert "| corag_greedy | corag | greedy:L=1 |" in table
    assert (out / "eval" / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "study written to" in capsys.readouterr().out

    # Resume: a second run finds every stage done and recomputes nothing.
    (out / "summary.json").unlink()
    assert quickstart.main(["--out_dir", str(out), *SMALL]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert set(again["timings_s"]) == {"evaluate"}
    assert again["results"] == results

    # Other settings in the same folder are refused (its finished stages would be reused as they are).
    with pytest.raises(InputError, match=r"study\.json, field 'seed': .*seed: \d+ -> 7"):
        quickstart.main(["--out_dir", str(out), *SMALL, "--seed", "7"])


def test_warm_only_trains_a_warm_model_to_reuse_and_records_what_made_it(tmp_path):
    warm, out = tmp_path / "warm", tmp_path / "study"
    args = ["--config", str(CONFIG), "--out_dir", str(out), *SMALL]
    assert toystudy.main([*args, "--seed", "5", "--warm_only", "true", "--warm_dir", str(warm)]) == 0
    assert (warm / "model.safetensors").is_file() and not (out / "index").exists()  # stopped there
    made = json.loads((warm / "warm_start.json").read_text())
    assert made["study_config"]["excluded_world_seed"] == 5
    assert made["study_config"]["warm_mixed_steps"] == 6 and made["study_config"]["model_head_dim"] == 64
    assert set(made["heldout_accuracy"]) and all(0.0 <= v <= 1.0 for v in made["heldout_accuracy"].values())


def test_a_bad_curriculum_entry_is_one_clear_error(tmp_path):
    from corag.errors import InputError

    with pytest.raises(InputError, match="warm_curriculum.*'reading=0.5'"):
        quickstart.main(["--out_dir", str(tmp_path / "qs"), *SMALL, "--warm_curriculum", "reading=0.5"])
    assert not (tmp_path / "qs").exists()  # rejected before anything is written


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("diagnose_questions", "-1"),
        ("warm_final_steps", "-2"),
        ("warm_final_mixture", "final=x"),
        ("sft_epochs", "0"),
        ("dtype", "float16"),
        ("test_hops", "5"),
        ("warm_unanswerable", "1.5"),
    ],
)
def test_an_out_of_range_setting_is_one_clear_error_naming_its_field(tmp_path, field, value):
    from corag.errors import InputError

    with pytest.raises(InputError, match=f"{field}.*{value}"):
        quickstart.main(["--out_dir", str(tmp_path / "qs"), *SMALL, f"--{field}", value])
    assert not (tmp_path / "qs").exists()


def test_compiling_without_a_cpp_compiler_is_one_clear_error(monkeypatch):
    from corag.errors import InputError
    from corag.toy.study import StudyConfig

    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(InputError, match="warm_compile.*C\\+\\+ compiler"):
        StudyConfig(warm_compile=True)
    StudyConfig(warm_compile=False)
    StudyConfig(warm_compile=True, warm_dir="runs/warm")  # a warm model to reuse is not compiled


@pytest.mark.parametrize(("cuda", "amx", "expected"), [(False, True, "bfloat16"), (False, False, "float32"),
                                                       (True, False, "bfloat16")])  # fmt: skip
def test_auto_dtype_is_bfloat16_only_where_its_products_are_fast(monkeypatch, cuda, amx, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert compute_dtype("auto") == expected
    assert compute_dtype("float32") == "float32"  # an explicit setting is kept


def test_judge_headroom_scores_the_penalty_against_a_perfect_and_a_link_checking_judge():
    world = generate_world(seed=3, num_entities=60, num_distractors=15, train_per_hop=4, test_per_hop=4)
    first, second = [e for e in world.test if e.meta["hops"] == 3][:2]
    gold = [{"subquery": s.subquery, "subanswer": s.subanswer} for s in first.decomposition]
    relations = first.meta["relations"]
    # Reading slipped at step 2; the chain still asks about what it read (every link kept).
    misread = [*gold[:1], {**gold[1], "subanswer": "Nobody"}]
    misread.append({"subquery": question(relations[2:], "Nobody"), "subanswer": "Elsewhere"})
    # Step 3 asks about the first sub-answer instead of the second (a broken link).
    broken = [*gold[:2], {"subquery": question(relations[2:], gold[0]["subanswer"]), "subanswer": "Nowhere"}]
    records = [
        {"chains": [broken, gold, misread, broken], "penalties": [-1.0, -2.0, -3.0, -0.5], "best_chain": 2},
        {"chains": [[{"subquery": s.subquery, "subanswer": s.subanswer} for s in second.decomposition]] * 2,
         "penalties": [-1.0, None], "best_chain": 0},
    ]  # fmt: skip
    judged = judge_headroom([first, second], records)
    assert list(judged) == ["3"]
    # The first question: greedy wrong, a perfect judge and the link check right, the penalty wrong;
    # the right chain beats two of its three wrong ones on penalty. The second: every chain right.
    assert judged["3"] == {
        "questions": 2, "greedy": 1, "any": 2, "penalty": 1, "link_check": 2, "pairs": 3, "right_first": 0.667
    }  # fmt: skip
