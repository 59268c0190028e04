"""`corag smoke --small`: every stage of the cluster path, small, on the toy world through the same code;
a stage that fails is one line and the stages that do not need it go on; bad input refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corag.cli import main as cli
from corag.commands.smoke import STAGE_NAMES


def read(out: Path) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads((out / "smoke.json").read_text())["stages"]}


@pytest.mark.slow
def test_the_small_smoke_runs_every_stage_and_writes_its_table(tmp_path: Path, capsys) -> None:
    out = tmp_path / "smoke"
    assert cli(["smoke", "--small", "--out_dir", str(out), "--minutes", "20"]) == 0
    printed = capsys.readouterr().out
    stages = read(out)
    assert list(stages) == list(STAGE_NAMES)
    assert {name: s["status"] for name, s in stages.items()} == dict.fromkeys(STAGE_NAMES, "ok")
    # each rate read from the stage's own outputs
    assert stages["encode"]["rates"]["passages"] == 50  # the toy world's corpus, encoded whole
    assert stages["encode"]["rates"]["passages_per_s_per_gpu"] > 0
    for name in ("sample", "evaluate", "search-r1"):
        assert stages[name]["rates"]["tokens_per_s_per_engine"] > 0, name
    assert stages["sft"]["rates"]["tokens_per_s_per_gpu"] > 0
    assert stages["grpo"]["rates"]["grpo_tokens_per_s_per_gpu"] > 0
    assert stages["sft-resume"]["rates"]["global_step"] == 3  # 2 steps saved, resumed for one more
    # memory: every command's peak, and the plan's figure beside it where the stage has a plan
    for name in ("sft", "grpo", "evaluate"):
        assert stages[name]["memory"]["host_peak"] > 0 and stages[name]["planned"] > 0, name
        assert stages[name]["ratio"] == pytest.approx(
            stages[name]["memory"]["host_peak"] / stages[name]["planned"]
        )
    table = (out / "smoke.md").read_text()
    for name in STAGE_NAMES:
        assert (
            f"| {name} | ok" in table and f"| {name} | ok" in printed
        )  # "ok (note)" where the stage ran a variant
    # the merged evaluation holds every question once, from its two parts
    merged = [json.loads(line) for line in (out / "eval" / "greedy_L2" / "predictions.jsonl").open()]
    assert len(merged) == len({r["query_id"] for r in merged}) == 4
    assert len(list((out / "eval" / "parts").iterdir())) == 2


@pytest.mark.slow
def test_a_stage_that_fails_is_one_line_and_the_others_go_on(tmp_path: Path, capsys) -> None:
    out = tmp_path / "smoke"
    missing = tmp_path / "no-such-model"
    stages = ["data", "encode", "serve", "sft", "sft-resume", "grpo", "search-r1"]
    status = cli(["smoke", "--small", "--out_dir", str(out), "--minutes", "20", "--sft_model", str(missing),
                  "--stages", *stages])  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 1
    result = read(out)
    assert list(result) == stages
    assert result["sft"]["status"] == "failed"
    assert str(missing) in result["sft"]["reason"] and "\n" not in result["sft"]["reason"]
    assert result["sft-resume"] == {**result["sft-resume"], "status": "skipped", "reason": "needs sft"}
    assert result["grpo"]["reason"] == "needs sft-resume"
    # before and after the failure, the stages that do not need it ran
    assert [result[n]["status"] for n in ("data", "encode", "serve", "search-r1")] == ["ok"] * 4
    line = next(ln for ln in printed.splitlines() if ln.startswith("sft: failed"))
    assert line.endswith(f"log {out / 'logs' / 'sft.log'}") and str(missing) in line
    row = next(ln for ln in (out / "smoke.md").read_text().splitlines() if ln.startswith("| sft |"))
    assert row.startswith("| sft | failed: exit status ") and str(missing) in row


def test_bad_input_is_one_line_and_nothing_is_written(tmp_path: Path, capsys) -> None:
    out = tmp_path / "smoke"
    bad = tmp_path / "sft.yaml"
    bad.write_text("learning_rat: 1.0e-4\n")
    cases = {
        ("--small", "--sft_config", str(bad)): "learning_rat",
        ("--small", "--sft_config", str(tmp_path / "none.yaml")): "no such config",
        ("--small", "--stages", "sample", "train"): "unknown stage(s) ['train']",
        (): "no GPU visible on this node",  # the 8B configs on a node without GPUs
    }
    for flags, message in cases.items():
        assert cli(["smoke", "--out_dir", str(out), *flags]) == 2, flags
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and err.startswith("corag smoke: error:"), (flags, err)
        assert not out.exists()


def test_one_gpu_runs_the_variants_that_fit_it(tmp_path: Path) -> None:
    """`--gpus 1` with the 8B configs on an 80 GB GPU, here without vLLM and without the weights: random
    weights from each model's config, the transformers backend, LoRA where full fine-tuning does not fit."""
    from corag.commands.smoke import Smoke, SmokeConfig, resolve
    from corag.plan import Hardware, card_memory

    args = resolve(SmokeConfig(out_dir=str(tmp_path / "smoke"), gpus=1, minutes=10))
    stages = {s.name: s for s in Smoke(args, Hardware(1, 1, card_memory("80GB"))).stages()}
    assert list(stages) == list(STAGE_NAMES)
    assert stages["weights"].note == (
        "random weights of meta-llama/Llama-3.1-8B-Instruct, corag/CoRAG-Llama3.1-8B-MultihopQA, "
        "PeterJinGo/SearchR1-nq_hotpotqa_train-qwen2.5-7b-em-ppo, intfloat/e5-large-v2: not here"
    )
    encode = stages["encode"].commands[0].args
    assert encode[encode.index("--model") + 1] == str(tmp_path / "smoke" / "models" / "e5-large-v2")
    sample = stages["sample"].commands[0].args
    assert sample[sample.index("--model") + 1] == str(
        tmp_path / "smoke" / "models" / "meta-llama--Llama-3.1-8B-Instruct"
    )
    assert sample[sample.index("--backend") + 1] == "hf" and stages["sample"].note.startswith(
        "transformers backend"
    )
    sft = stages["sft"]
    assert sft.skip is None and sft.note == "LoRA r=16: full fine-tuning does not fit 1 GPU(s)"
    assert {"--use_peft", "--merge_lora"} <= set(sft.commands[0].args) and sft.planned < card_memory("80GB")
    grpo = stages["grpo"]
    assert "transformers rollouts: vLLM not installed" in grpo.note and "--use_peft" in grpo.commands[0].args
    assert (
        grpo.commands[0].args[grpo.commands[0].args.index("--model_name_or_path") + 1].endswith("sft/merged")
    )
    # each stage's share of the ten minutes
    assert sum(s.share for s in stages.values()) == pytest.approx(1.0)


def test_random_weights_take_the_shape_the_plan_knows(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from corag.commands.smoke import random_checkpoint
    from corag.plan import model_shape

    folder = random_checkpoint("toy", tmp_path / "toy")
    shape = model_shape("toy")
    model = AutoModelForCausalLM.from_pretrained(folder)
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.intermediate_size) == (shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.head_dim,
                                     shape.intermediate)  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Rira?"}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    assert max(ids) < c.vocab_size and model.generate(
        __import__("torch").tensor([ids]), max_new_tokens=2).shape[1] == len(ids) + 2  # fmt: skip
