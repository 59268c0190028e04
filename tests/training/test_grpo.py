"""GRPO on chains (corag/training/grpo.py): trl's GRPOTrainer takes steps on chain rollouts, on the
tiny model and on SmolLM2-135M-Instruct with LoRA, and resumes at the same step with the same data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from corag.chain import GenerationLimits
from corag.data.corpus import Corpus
from corag.errors import InputError
from corag.retrieval.bm25 import BM25Retriever
from corag.training.grpo import ChainGRPOTrainer, check_trainer_settings, check_whole_groups
from corag.training.rollout import RolloutConfig


class Recording(ChainGRPOTrainer):
    """Keeps which questions each step's rollout sampled."""

    def sample_groups(self, query_ids):
        self.sampled = [*getattr(self, "sampled", []), (self.state.global_step, list(query_ids))]
        return super().sample_groups(query_ids)


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
        rollout_config=RolloutConfig(
            max_chain_length=1, token_cost=0.5, docs=docs
        ),  # rewards differ by the tokens spent
        limits=limits,
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
    for key in ("reward", "reward_std", "answer_em", "answer_f1", "chain_steps", "tokens_per_chain", "loss"):
        assert len(logged(trainer, key)) == 2, key
    assert all(t > 0 for t in logged(trainer, "tokens_per_chain"))
    assert [step for step, _ in trainer.sampled] == [0, 1]


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
    refused = {
        "vllm_mode": {"vllm_mode": "server"},
        "vllm_tensor_parallel_size": {"vllm_tensor_parallel_size": 2},
        "vllm_importance_sampling_correction": {"vllm_importance_sampling_correction": True},
        "vllm_enable_sleep_mode": {"vllm_enable_sleep_mode": True},
        "num_iterations": {"num_iterations": 2},
    }
    for field, change in refused.items():
        with pytest.raises(InputError) as error:
            check_trainer_settings(settings(**change))
        assert error.value.field == field and "\n" not in str(error.value)


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
