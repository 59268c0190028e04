"""GRPO on chains (corag/training/grpo.py): trl's GRPOTrainer takes steps on chain rollouts (the sampler's
own ids), on the tiny model and on SmolLM2-135M-Instruct with LoRA; groups without spread are replaced
within a bound; the held-out slice is answered at its interval; it resumes at the same step with the
same data; a trl without the private names it relies on is refused in one line."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from corag.chain import GenerationLimits
from corag.data.corpus import Corpus
from corag.errors import InputError
from corag.retrieval.bm25 import BM25Retriever
from corag.training.grpo import (
    ChainGRPOTrainer,
    TrlVersionError,
    check_stop_on_vllm,
    check_trainer_settings,
    check_trl,
    check_whole_groups,
    importance_ratio,
    ratio_spread,
    row_chunks,
)
from corag.training.rollout import RolloutConfig, chain_rows

REPO = Path(__file__).resolve().parents[2]


class Recording(ChainGRPOTrainer):
    """Keeps which questions each rollout sampled, and every group it rolled out."""

    def sample_groups(self, query_ids, key):
        self.sampled = [*getattr(self, "sampled", []), (self.state.global_step, list(query_ids))]
        groups = super().sample_groups(query_ids, key)
        self.rolled = [*getattr(self, "rolled", []), *groups]
        return groups


@pytest.fixture(scope="module")
def world(toy_world, toy_dir):
    return (
        Corpus.load(toy_dir / "corpus.jsonl"),
        BM25Retriever.from_passages(toy_world.passages),
        toy_world.train[:6],
    )


class StopAfter(TrainerCallback):
    """Ends training after `step` steps, as a job killed right after its checkpoint would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def make(
    world,
    model_dir: Path,
    out: Path,
    max_steps: int,
    peft_config=None,
    stop_after=None,
    limits=None,
    docs=20,
    held_out=(),
    max_extra_questions=8,
    trainer_class=None,
    **args,
) -> Recording:
    corpus, retriever, questions = world
    config = GRPOConfig(
        output_dir=str(out),
        num_generations=2,
        per_device_train_batch_size=2,  # one question's group a step
        max_steps=max_steps,
        learning_rate=args.pop("learning_rate", 1e-3),
        logging_steps=1,
        save_strategy=args.pop("save_strategy", "steps"),
        save_steps=1,
        report_to="none",
        bf16=False,
        use_cpu=True,
        seed=0,
        temperature=0.7,
        **args,
    )
    return (trainer_class or Recording)(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        args=config,
        peft_config=peft_config,
        questions=questions,
        corpus=corpus,
        retriever=retriever,
        rollout_config=RolloutConfig(  # rewards differ by the tokens spent
            max_chain_length=1,
            reward=["f1", "-0.5*tokens"],
            docs=docs,
            max_extra_questions=max_extra_questions,
        ),
        limits=limits,
        held_out=held_out,
        callbacks=[StopAfter(stop_after)] if stop_after else None,
    )


def logged(trainer, key: str) -> list[float]:
    return [row[key] for row in trainer.state.log_history if key in row]


def test_the_trainer_takes_steps_on_the_tiny_model(world, short_model_dir, tmp_path):
    trainer = make(world, short_model_dir, tmp_path / "run", max_steps=2)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert changed
    keys = ("reward", "reward_std", "answer_em", "answer_f1", "chain_steps", "stop_rate", "tokens_per_chain",
            "zero_spread", "extra_questions", "unfilled", "rows_per_chain", "entropy", "loss")  # fmt: skip
    for key in keys:
        assert len(logged(trainer, key)) == 2, key
    assert all(t > 0 for t in logged(trainer, "tokens_per_chain"))
    assert [step for step, _ in trainer.sampled][:1] == [0]
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rollouts] == [1, 1, 2, 2]  # one group (2 chains) a logging step
    assert {"question", "subqueries", "subanswers", "answer", "reward", "advantage"} <= set(rollouts[0])


def test_the_batch_trains_exactly_the_sampled_ids(world, short_model_dir, tmp_path):
    trainer = make(world, short_model_dir, tmp_path / "run", max_steps=1)
    groups, _ = trainer.groups_with_spread([world[2][0].id])
    rows = [row for group in groups for chain in group for row in chain_rows(chain)]
    batch = trainer.row_batch(rows)
    trained = batch["completion_mask"].bool()
    got = sorted(
        (tuple(ids[mask].tolist()), tuple(logps[mask].tolist()))
        for ids, logps, mask in zip(
            batch["completion_ids"], batch["sampling_per_token_logps"], trained, strict=True
        )
        if mask.any()
    )
    assert got == sorted((r["completion_ids"], pytest.approx(r["logprobs"])) for r in rows)
    samples = [s for g in groups for c in g for _, completion in c.trace for s in completion.samples]
    assert len(got) == len(samples) > 0


class Flat(Recording):
    """Chains of the questions in `flat` all score 0: their groups have no spread."""

    flat: set[str] = set()

    def sample_groups(self, query_ids, key):
        groups = super().sample_groups(query_ids, key)
        for group in groups:
            if group[0].result.query_id in self.flat:
                for chain in group:
                    chain.reward = chain.advantage = 0.0
        return groups


def test_a_group_without_spread_is_replaced_by_another_questions(world, short_model_dir, tmp_path):
    trainer = make(world, short_model_dir, tmp_path / "run", max_steps=1, trainer_class=Flat)
    first = world[2][0].id
    trainer.flat = {first}
    kept, rolled = trainer.groups_with_spread([first])
    assert len(rolled) == 2 and rolled[0][0].result.query_id == first
    replacement = rolled[1][0].result.query_id
    assert replacement != first and [g[0].result.query_id for g in kept] == [replacement]
    again = make(world, short_model_dir, tmp_path / "again", max_steps=1, trainer_class=Flat)
    again.flat = {first}
    assert [g[0].result.query_id for g in again.groups_with_spread([first])[1]] == [first, replacement]


def test_the_bound_on_extra_questions_holds(world, short_model_dir, tmp_path, caplog):
    trainer = make(
        world, short_model_dir, tmp_path / "run", max_steps=1, trainer_class=Flat, max_extra_questions=2
    )
    trainer.flat = {q.id for q in world[2]}
    with caplog.at_level("INFO", logger="corag.grpo"):
        kept, rolled = trainer.groups_with_spread([world[2][0].id])
    assert kept == [] and len(rolled) == 3  # the batch's question and two more, no further
    assert len({g[0].result.query_id for g in rolled}) == 3
    assert "max_extra_questions" in caplog.text
    trainer.log_groups(kept, rolled, 1, 0, "train")
    metrics = trainer._metrics["train"]
    assert (
        metrics["zero_spread"][-1] == metrics["unfilled"][-1] == 1.0
    )  # the step's one question trains nothing
    assert metrics["extra_questions"][-1] == 2.0
    none = make(
        world, short_model_dir, tmp_path / "none", max_steps=1, trainer_class=Flat, max_extra_questions=0
    )
    none.flat = trainer.flat
    assert len(none.groups_with_spread([world[2][0].id])[1]) == 1


def test_the_held_out_slice_is_answered_at_its_interval(world, short_model_dir, tmp_path, toy_world):
    from corag.evaluation import answer_row, parse_runs, rule_of, run_method
    from corag.lm import load_lm

    held_out = toy_world.test[:3]
    corpus, retriever, _ = world
    (run,) = parse_runs(["greedy:L=3"])
    records = run_method(run, held_out, load_lm(short_model_dir, backend="hf", device="cpu"), retriever,
                         corpus, tmp_path / "evaluate.jsonl", progress=False)  # fmt: skip
    em = (
        100
        * sum(
            answer_row(r["predictions"], q, rule_of(q))["em"] for r, q in zip(records, held_out, strict=True)
        )
        / 3
    )
    tokens = sum(r["usage"]["total_tokens"] for r in records) / 3

    trainer = make(world, short_model_dir, tmp_path / "run", max_steps=3, eval_steps=2, held_out=held_out)
    trainer.train()
    lines = (tmp_path / "run" / "heldout.jsonl").read_text().splitlines()
    evals = [json.loads(line) for line in lines]
    assert [e["step"] for e in evals] == [0, 2, 3]
    assert evals[0]["em"] == pytest.approx(em, abs=0.01)  # the untrained policy, as `corag evaluate` decodes
    assert evals[0]["tokens"] == pytest.approx(tokens, abs=0.01)
    assert [row["step"] for row in trainer.state.log_history if "heldout_em" in row] == [2]
    assert (tmp_path / "run" / "progress.png").stat().st_size > 0


def test_a_trl_without_a_private_name_is_refused_in_one_line(tmp_path):
    with pytest.raises(TrlVersionError) as error:
        check_trl({("trl.trainer.utils", None): ("pad", "no_such_helper")})
    message = str(error.value)
    assert "trl.trainer.utils.no_such_helper" in message and "1.16" in message and "\n" not in message
    code = (
        "import sys, trl.trainer.grpo_trainer as g; del g.GRPOTrainer._prepare_inputs; "
        "from corag.recipes.grpo import main; sys.exit(main(['--output_dir', 'x']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert "_prepare_inputs" in lines[-1] and "tested with trl 1.16" in lines[-1]
    assert "Traceback" not in done.stderr


def test_importance_ratio_by_hand():
    policy = torch.tensor([[-1.0, -2.0, 0.0]])
    sampler = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    # per token: exp(0.5) = 1.6487, exp(-1.0) = 0.3679, masked: exp(0) = 1
    assert importance_ratio(policy, sampler, mask, "token_truncate", None, 1.5)[0].tolist() == pytest.approx(
        [1.5, math.exp(-1.0), 1.0]
    )
    assert importance_ratio(policy, sampler, mask, "token_mask", 0.5, 1.5)[0].tolist() == pytest.approx(
        [0.0, 0.0, 1.0]
    )
    # per sequence: exp(0.5 - 1.0) = 0.6065
    assert importance_ratio(policy, sampler, mask, "sequence_truncate", None, 3.0)[
        0
    ].tolist() == pytest.approx([math.exp(-0.5)])


def test_resume_continues_at_the_same_step_with_the_same_data(world, short_model_dir, tmp_path):
    whole = make(world, short_model_dir, tmp_path / "whole", max_steps=3)
    whole.train()
    cut = make(world, short_model_dir, tmp_path / "cut", max_steps=3, stop_after=1)
    cut.train()  # interrupted after one step, its checkpoint written
    assert cut.state.global_step == 1 and (tmp_path / "cut" / "checkpoint-1").is_dir()
    resumed = make(world, short_model_dir, tmp_path / "cut", max_steps=3)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.sampled == whole.sampled[1:]  # steps 1 and 2, the same questions
    # the resumed history holds the checkpoint's first step, then steps as the whole run took them
    assert logged(resumed, "reward") == pytest.approx(logged(whole, "reward"))
    assert logged(resumed, "tokens_per_chain") == logged(whole, "tokens_per_chain")
    for (name, a), (_, b) in zip(
        whole.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert torch.allclose(a, b, atol=1e-6), name


def test_micro_steps_of_like_width_give_trls_step(world, short_model_dir, tmp_path):
    """Rows sorted by length and each micro-step cut to its widest row: the step equals the one trl's
    own split (shuffled rows, all as wide as the widest) takes, for less compute."""

    class TrlSplit(ChainGRPOTrainer):
        def _prepare_inputs(self, generation_batch):
            return GRPOTrainer._prepare_inputs(self, generation_batch)

    runs = {}
    for name, cls in (("ours", ChainGRPOTrainer), ("trl", TrlSplit)):
        trainer = make(world, short_model_dir, tmp_path / name, max_steps=1, gradient_accumulation_steps=2,
                       loss_type="dapo", save_strategy="no", optim="sgd", trainer_class=cls)  # fmt: skip
        trainer.train()
        runs[name] = trainer
    ours, trl = runs["ours"], runs["trl"]  # SGD: the update is the gradient, scaled
    for (name, a), (_, b) in zip(ours.model.named_parameters(), trl.model.named_parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-7), name
    widths = [b["prompt_ids"].size(1) + b["completion_ids"].size(1) for b in ours._buffered_inputs]
    full = [b["prompt_ids"].size(1) + b["completion_ids"].size(1) for b in trl._buffered_inputs]
    assert widths[0] < widths[-1] <= full[0] == full[-1]
    assert sum(b["advantages"].numel() for b in ours._buffered_inputs) == sum(
        b["advantages"].numel() for b in trl._buffered_inputs
    )


def test_a_process_samples_whole_groups():
    check_whole_groups(per_device_batch=4, steps_per_generation=2, num_generations=8)
    with pytest.raises(InputError, match="whole groups") as error:
        check_whole_groups(per_device_batch=3, steps_per_generation=1, num_generations=2)
    assert error.value.field == "per_device_train_batch_size"


def test_vllm_rollouts_take_the_colocated_engine_and_refuse_what_they_cannot_carry(tmp_path):
    def settings(**changes):
        base = dict(
            output_dir=str(tmp_path), use_cpu=True, bf16=False, num_generations=2, use_vllm=True,
            vllm_mode="colocate", vllm_importance_sampling_correction=False, report_to="none",
        )  # fmt: skip
        return GRPOConfig(**{**base, **changes})

    check_trainer_settings(settings())  # the shipped 8B configs' vLLM settings
    check_trainer_settings(settings(vllm_importance_sampling_correction=True))  # the sampler's logps are kept
    refused = {
        "vllm_mode": {"vllm_mode": "server"},
        "vllm_tensor_parallel_size": {"vllm_tensor_parallel_size": 2},
        "vllm_importance_sampling_mode": {
            "vllm_importance_sampling_correction": True,
            "vllm_importance_sampling_mode": "tokens",
        },
        "vllm_enable_sleep_mode": {"vllm_enable_sleep_mode": True},
        "num_iterations": {"num_iterations": 2},
    }
    for field, change in refused.items():
        with pytest.raises(InputError) as error:
            check_trainer_settings(settings(**change))
        assert error.value.field == field and "\n" not in str(error.value)
    # the stop decision is drawn at temperature 1: vLLM's importance correction needs the rollouts there
    corrected = {"vllm_importance_sampling_correction": True}
    check_stop_on_vllm(settings(temperature=0.7), RolloutConfig(max_chain_length=3))  # no correction
    check_stop_on_vllm(settings(temperature=1.0, **corrected), RolloutConfig(max_chain_length=3))
    check_stop_on_vllm(
        settings(temperature=0.7, **corrected), RolloutConfig(max_chain_length=3, sampled_calls=["final"])
    )
    with pytest.raises(InputError, match="drawn at temperature 1") as error:
        check_stop_on_vllm(settings(temperature=0.7, **corrected), RolloutConfig(max_chain_length=3))
    assert error.value.field == "temperature"


def test_settings_that_would_silently_change_training_are_refused_in_one_line(tmp_path):
    def settings(**changes):
        base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, num_generations=2, report_to="none")
        return GRPOConfig(**{**base, **changes})

    check_trainer_settings(settings(loss_type="dapo", gradient_accumulation_steps=2), env={})
    zero3 = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}
    refused = [
        ("loss_type", settings(loss_type="grpo"), {}),
        ("loss_type", settings(loss_type="bnpo"), {}),
        ("steps_per_generation", settings(gradient_accumulation_steps=2, steps_per_generation=4), {}),
        ("use_vllm", settings(), zero3),
        # a DeepSpeed config given to the trainer (a namespace: TrainingArguments would switch ZeRO-3 on
        # for the whole process)
        (
            "use_vllm",
            SimpleNamespace(**{**vars(settings()), "deepspeed": {"zero_optimization": {"stage": 3}}}),
            {},
        ),
    ]
    for field, args, env in refused:
        with pytest.raises(InputError) as error:
            check_trainer_settings(args, env=env)
        assert error.value.field == field and "\n" not in str(error.value)
    check_trainer_settings(settings(), env={**zero3, "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"})


def test_the_importance_sampling_ratio_is_logged(world, short_model_dir, tmp_path):
    """With the correction on (as vLLM rollouts have it), a batch's ratio over its trained tokens goes to
    trl's logs: mean, min and max, those of the ratio the loss uses."""
    trainer = make(world, short_model_dir, tmp_path / "run", max_steps=1)
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = True  # rollouts as if from an engine
    trainer.vllm_importance_sampling_mode = "token_truncate"
    trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max = None, 3.0
    trainer.model.train()  # as in a training step
    rows = [
        {"prompt_ids": (5, 6, 7), "completion_ids": (8, 9), "logprobs": (-1.0, -9.0), "advantage": 1.0},
        {
            "prompt_ids": (5,),
            "completion_ids": (10, 11, 12),
            "logprobs": (-2.0, -3.0, -0.5),
            "advantage": -1.0,
        },
    ]
    batch = trainer.row_batch(rows)
    metrics = trainer._metrics["train"]
    ratio, mask = batch["importance_sampling_ratio"], batch["completion_mask"].bool()
    trained = ratio[mask]
    assert trained.numel() == 5
    assert metrics["sampling/importance_sampling_ratio/mean"] == [pytest.approx(trained.mean().item())]
    assert metrics["sampling/importance_sampling_ratio/min"] == [pytest.approx(trained.min().item())]
    assert metrics["sampling/importance_sampling_ratio/max"] == [pytest.approx(trained.max().item())]
    assert trained.max().item() <= 3.0  # truncated at the clip


def test_ratio_spread_by_hand():
    ratio = torch.tensor([[0.5, 2.0, 9.0], [1.5, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert ratio_spread(ratio, mask) == pytest.approx({"mean": 4.0 / 3, "min": 0.5, "max": 2.0})
    sequence = torch.tensor([[0.8], [1.4], [7.0]])
    rows = torch.tensor([[1, 1], [1, 0], [0, 0]])  # the third row carries no loss
    assert ratio_spread(sequence, rows) == pytest.approx({"mean": 1.1, "min": 0.8, "max": 1.4})


@pytest.mark.slow
def test_smollm2_with_lora_takes_a_step(world, smollm2_dir, tmp_path):
    from peft import LoraConfig

    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    short = GenerationLimits(subquery_max_new_tokens=16, subanswer_max_new_tokens=16, final_max_new_tokens=16)
    trainer = make(
        world,
        smollm2_dir,
        tmp_path / "run",
        max_steps=1,
        peft_config=lora,
        limits=short,
        docs=2,
        learning_rate=1e-2,
        gradient_checkpointing=False,
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert logged(trainer, "tokens_per_chain")[0] > 0


def test_rows_are_batched_up_to_the_token_bound():
    widths = [2, 2, 5, 6, 9, 30]
    assert row_chunks(widths, 12) == [(0, 2), (2, 4), (4, 5), (5, 6)]  # 2x2, 2x6, 1x9, 30 alone
    assert row_chunks(widths, 1000) == [(0, 6)]
    assert row_chunks([], 10) == []
    for bound in (1, 7, 18, 40):
        chunks = row_chunks(widths, bound)
        assert [i for a, b in chunks for i in range(a, b)] == list(range(len(widths)))
        assert all(b - a == 1 or (b - a) * max(widths[a:b]) <= bound for a, b in chunks)


def test_the_old_policy_pass_batches_rows_and_counts_its_forwards(world, short_model_dir, tmp_path):
    """The importance pass over rows in token-bounded chunks (each cut to its own widest row) gives the
    log-probabilities a forward over each row alone gives, in fewer forwards, and counts them. Three
    copies each of two rows of different widths: chunks of like rows, so no chunk pads a row."""
    trainer = make(world, short_model_dir, tmp_path / "run", max_steps=1)
    groups = trainer.sample_groups([world[2][0].id], key="k")
    rows = [row for group in groups for chain in group for row in chain_rows(chain)]
    width = {len(r["prompt_ids"]) + len(r["completion_ids"]): r for r in rows}
    short, wide = sorted(width)[0], sorted(width)[-1]
    batch = trainer.row_batch([width[short]] * 3 + [width[wide]] * 3)
    trainer.rollout_config.logprob_batch_tokens = 1  # every row alone
    trainer.logprob_forwards = 0
    alone = trainer.policy_logps(batch, reference=False)
    assert trainer.logprob_forwards == 6
    trainer.rollout_config.logprob_batch_tokens = 3 * wide
    trainer.logprob_forwards = 0
    chunked = trainer.policy_logps(batch, reference=False)
    assert trainer.logprob_forwards == 2
    mask = batch["completion_mask"].bool()
    assert torch.allclose(chunked[mask], alone[mask], atol=1e-5)


SHARE_WORKER = """
import json, sys
import torch.distributed as dist
from corag.training.grpo import replacement_share

rank, port, out, missing = int(sys.argv[1]), sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
pool = [f"q{i}" for i in range(10)]
rounds = [replacement_share(m, pool, room) for m, room in zip(missing, (8, 8, 1))]
open(f"{out}/{rank}.json", "w").write(json.dumps(rounds))
dist.destroy_process_group()
"""


def test_a_replacement_is_decided_over_two_processes(tmp_path):
    """Two gloo processes missing 3 and 0 groups, then 2 and 3, then 4 and 4 with room for 1: each round
    takes the same questions on both, as many as are missing over both (within the room), and each
    process rolls out at most its share (half, rounded up)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    missing = {0: [3, 2, 4], 1: [0, 3, 4]}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SHARE_WORKER, str(r), str(port), str(tmp_path), json.dumps(missing[r])]
        )
        for r in (0, 1)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    a, b = (json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1))
    for (taken_a, mine_a), (taken_b, mine_b), total in zip(a, b, (3, 5, 1), strict=True):
        assert taken_a == taken_b and len(taken_a) == total
        assert sorted(mine_a + mine_b) == sorted(taken_a) and not set(mine_a) & set(mine_b)
        assert max(len(mine_a), len(mine_b)) <= -(-total // 2)
