"""GRPO on chains (reinforcement with retrieval in the loop), after SFT, top to bottom.

    corag train grpo --config configs/grpo/toy.yaml --model_name_or_path runs/sft/toy --output_dir runs/grpo/toy
    accelerate launch --config_file configs/accelerate/single.yaml -m corag.recipes.grpo \
        --config configs/grpo/toy.yaml --model_name_or_path runs/sft/toy --output_dir runs/grpo/toy

(recipes/grpo.py, in a checkout, is the same program.)

Each step takes `questions_per_step` training questions, split over the processes whatever their
number (steps_per_generation follows). For each, `num_generations` chains are sampled by the
policy being trained (corag.training.rollout: sub-queries, sub-answers, the stop decision and the final
answer sampled at `temperature`, each kind unless left out of `sampled_calls`; sub-queries searched in
`retriever`; the released prompt formats), rewarded by the weighted terms of `reward`
(corag.training.rewards), with advantages normalised per question; groups whose chains all scored alike
are replaced by other questions' (`max_extra_questions`); then trl's GRPO loss falls on the ids the
sampler drew, never on retrieved text or greedy calls (corag.training.grpo). With `eval_questions`, the
policy answers a held-out slice at step 0, every `eval_steps` and at the end (heldout.jsonl, a plot in
progress.png; corag.training.progress). Full fine-tuning or LoRA (`use_peft: true`); resumes from the
last checkpoint in output_dir with the same questions and chains (on SIGUSR1, Slurm's warning before the
time limit, it saves a checkpoint after the step in hand and exits with status 75); W&B goes offline without a key or
network, as in the SFT recipe. Rollouts run on
each process's own copy of the policy (transformers), or on the vLLM engine trl colocates with it
(`use_vllm: true`, `vllm_mode: colocate`). On N nodes under Slurm:
`sbatch --nodes=N recipes/slurm_train.sh grpo zero3 CONFIG --serve-index INDEX [--key value ...]`.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback, set_seed
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import is_torch_bf16_gpu_available
from trl import GRPOConfig, ModelConfig, get_peft_config

from corag.chain import GenerationLimits
from corag.config import parse_config, read_config
from corag.errors import InputError
from corag.training.recipes import (
    StopOnWarning,
    attention_implementation,
    close_processes,
    end_stopped,
    fail,
    leave,
    train,
    wandb_offline_if_unreachable,
)
from corag.training.rollout import RolloutConfig

logger = logging.getLogger("corag.grpo")
PROG = "corag train grpo"


@dataclass
class RecipeArguments:
    """The training questions, the documents and where to search them, and a wall-time limit."""

    questions: str | None = field(
        default=None, metadata={"help": "training questions (any format corag reads; gold answers needed)"}
    )
    corpus: str | None = field(default=None, metadata={"help": "corpus file or dataset folder"})
    retriever: str | None = field(
        default=None, metadata={"help": "index folder from `corag index`, or a `corag serve-retriever` URL"}
    )
    task: str | None = field(default=None, metadata={"help": "task of the questions (default: their own)"})
    limit: int | None = field(default=None, metadata={"help": "only the first N questions"})
    time_limit_minutes: float | None = field(
        default=None,
        metadata={"help": "stop (and save) after the step that passes this many minutes of training"},
    )
    time_limit_clock: str = field(
        default="wall",
        metadata={
            "help": "what the time limit counts: wall (minutes on the clock) or cpu (the process's CPU "
            "minutes over its torch threads: wall time on an idle machine, unshortened by other load)"
        },
    )
    eval_questions: str | None = field(
        default=None, metadata={"help": "held-out questions the policy answers during training"}
    )
    eval_limit: int | None = field(default=None, metadata={"help": "only the first N held-out questions"})
    eval_method: str = field(
        default="greedy:L=3",
        metadata={"help": "how they are answered, as `corag evaluate --methods` takes it"},
    )
    questions_per_step: int | None = field(
        default=None,
        metadata={
            "help": "questions per optimizer step over all processes, whatever the number of GPUs: sets "
            "steps_per_generation and gradient_accumulation_steps to this x num_generations / "
            "(per_device_train_batch_size x processes)"
        },
    )


CONFIGS = (RecipeArguments, RolloutConfig, GenerationLimits, GRPOConfig, ModelConfig)


def compute_seconds() -> float:
    """CPU seconds of this process and its finished children over torch's thread count: the wall time the
    work would take on an idle machine, whatever else the machine runs meanwhile."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    busy = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    return busy / torch.get_num_threads()


class TimeLimit(TrainerCallback):
    """Ends training after the step during which `minutes` passed on the clock (`wall`, or `cpu`: see
    compute_seconds); the model is saved."""

    CLOCKS = {"wall": time.monotonic, "cpu": compute_seconds}

    def __init__(self, minutes: float, clock: str = "wall") -> None:
        self.now = self.CLOCKS[clock]
        self.seconds, self.start = minutes * 60, self.now()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 (transformers' callback signature)
        if self.now() - self.start >= self.seconds:
            logger.info("time limit reached after step %d", state.global_step)
            control.should_training_stop = True
        return control


def micro_steps(questions: int, num_generations: int, per_device: int, world_size: int) -> int:
    """Micro-steps a process takes per optimizer step (steps_per_generation) so that a step holds
    `questions` over `world_size` processes: each samples questions / world_size of them, `num_generations`
    chains each, and trains `per_device` chains' rows a micro-step; an InputError when it does not divide."""
    if questions < 1 or questions % world_size:
        raise InputError(
            f"{questions} questions a step do not split evenly over {world_size} process(es); "
            f"give a multiple of {world_size}",
            field="questions_per_step",
        )
    chains = questions // world_size * num_generations
    if chains % per_device:
        raise InputError(
            f"{questions} questions a step over {world_size} process(es) give each {chains} chains "
            f"({questions // world_size} x num_generations {num_generations}), not a multiple of "
            f"per_device_train_batch_size {per_device}",
            field="questions_per_step",
        )
    return chains // per_device


def with_questions_per_step(argv: list[str], world_size: int) -> list[str]:
    """`argv` and the steps_per_generation (one generation per optimizer step: the gradient accumulation
    too) that its `questions_per_step` gives on `world_size` processes, before trl sizes its batches."""
    values = read_config(CONFIGS, argv)
    if values["questions_per_step"] is None:
        return argv
    steps = micro_steps(
        values["questions_per_step"],
        values["num_generations"],
        values["per_device_train_batch_size"],
        world_size,
    )
    return [*argv, "--steps_per_generation", str(steps), "--gradient_accumulation_steps", str(steps)]


def parse_args(argv: list[str] | None = None) -> tuple:
    """Config file plus command-line overrides (corag.config); bf16 only where the device has it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not is_torch_bf16_gpu_available() and "--bf16" not in argv:
        logger.warning("bf16 is not available on this device; training in fp32")
        argv += ["--bf16", "false"]
    if not torch.cuda.is_available() and "--use_cpu" not in argv:
        argv += ["--use_cpu", "true"]
    try:
        from corag.evaluation import parse_runs
        from corag.training.grpo import check_trainer_settings  # refuses a trl it was not tested with

        argv = with_questions_per_step(argv, int(os.environ.get("WORLD_SIZE", "1")))  # as accelerate sets it
        data, rollout, limits, grpo, model = parse_config(CONFIGS, argv, __doc__.splitlines()[0])
        rollout.check()
        limits.check()
        check_trainer_settings(grpo)
        if len(parse_runs([data.eval_method])) != 1:
            raise InputError("one method setting, not a grid", field="eval_method")
    except (ValueError, InputError, ImportError) as e:
        fail(str(e), PROG)
    for name in ("questions", "corpus", "retriever"):
        if getattr(data, name) is None:
            fail(f"`{name}` is required", PROG)
    if model.model_name_or_path is None:
        fail("`model_name_or_path` is required (the SFT checkpoint)", PROG)
    if data.time_limit_clock not in TimeLimit.CLOCKS:
        fail(f"--time_limit_clock is wall or cpu, not {data.time_limit_clock!r}", PROG)
    model.attn_implementation = attention_implementation(model.attn_implementation)
    return data, rollout, limits, grpo, model


def main(argv: list[str] | None = None) -> int:
    data, rollout, limits, args, model_args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.process_index == 0 else logging.WARNING)
    set_seed(args.seed)
    warning = wandb_offline_if_unreachable(args.report_to, os.environ)
    if warning and args.process_index == 0:
        logger.warning(warning)

    # 1. Resume from the last checkpoint in output_dir unless told otherwise.
    checkpoint = args.resume_from_checkpoint
    if checkpoint is None and os.path.isdir(args.output_dir):
        checkpoint = get_last_checkpoint(args.output_dir)
    if checkpoint:
        logger.info("resuming from %s", checkpoint)

    # 2. The questions with their gold answers, the corpus and the retriever the chains search.
    from corag.data.corpus import Corpus
    from corag.data.formats import load_examples
    from corag.options import check_unique_ids
    from corag.retrieval import check_corpus, load_retriever

    try:
        questions = load_examples(data.questions, task=data.task)[: data.limit]
        check_unique_ids(questions, data.questions)
        unanswered = [q.id for q in questions if not q.answers]
        if unanswered:
            raise InputError(
                "has no gold answer to reward", file=data.questions, record=unanswered[0], field="answers"
            )
        held_out = load_examples(data.eval_questions)[: data.eval_limit] if data.eval_questions else []
        corpus = Corpus.load(data.corpus)
        check_corpus(data.retriever, corpus)  # an index over another corpus is refused before the model loads
        retriever = load_retriever(data.retriever)
    except InputError as e:
        fail(str(e), PROG)
    logger.info(
        "%d questions, %d chains each; processes: %d", len(questions), args.num_generations, args.world_size
    )
    logger.info(
        "%d questions a step over %d processes: %d micro-step(s) of %d chain(s) each",
        args.generation_batch_size // args.num_generations, args.world_size, args.steps_per_generation, args.per_device_train_batch_size,
    )  # fmt: skip

    # 3. The policy (the SFT checkpoint) and its tokenizer.
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        dtype=None if model_args.dtype in (None, "auto") else getattr(torch, model_args.dtype),
        attn_implementation=model_args.attn_implementation,
    )

    # 4. Train: chain rollouts, rewards and advantages are ours; the loss, optimizer and checkpoints trl's.
    from corag.training.grpo import ChainGRPOTrainer

    # Slurm's warning before the time limit saves a checkpoint after the step in hand and ends the run.
    near_limit = StopOnWarning()
    time_limit = (
        [TimeLimit(data.time_limit_minutes, data.time_limit_clock)] if data.time_limit_minutes else []
    )
    trainer = ChainGRPOTrainer(
        model=model,
        args=args,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        questions=questions,
        corpus=corpus,
        retriever=retriever,
        rollout_config=rollout,
        limits=limits,
        held_out=held_out,
        held_out_method=data.eval_method,
        callbacks=[*time_limit, near_limit],
    )
    result = train(trainer, checkpoint)
    if near_limit.stopped:
        return end_stopped(trainer)
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()

    # 5. A checkpoint AutoModelForCausalLM loads (a LoRA adapter with use_peft).
    trainer.save_model(args.output_dir)
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(args.output_dir)
    close_processes(trainer)
    logger.info("model saved to %s", args.output_dir)
    return 0


if __name__ == "__main__":
    leave(main())
