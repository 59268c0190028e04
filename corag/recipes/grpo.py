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
import sys
from dataclasses import dataclass, field

from trl import GRPOConfig, ModelConfig, get_peft_config

from corag.chain import GenerationLimits
from corag.config import parse_config, read_config
from corag.errors import InputError
from corag.training.recipes import (
    StopOnWarning,
    TimeLimitArguments,
    attention_implementation,
    close_processes,
    device_flags,
    end_stopped,
    fail,
    leave,
    load_model,
    load_tokenizer,
    resume_checkpoint,
    save_final,
    start_run,
    train,
)
from corag.training.rewards import check_reward_data
from corag.training.rollout import RolloutConfig

logger = logging.getLogger("corag.grpo")
PROG = "corag train grpo"


@dataclass
class RecipeArguments(TimeLimitArguments):
    """The training questions, the documents and where to search them, the held-out slice, and a limit
    on the training time."""

    questions: str | None = field(
        default=None, metadata={"help": "training questions (any format corag reads; gold answers needed)"}
    )
    corpus: str | None = field(default=None, metadata={"help": "corpus file or dataset folder"})
    retriever: str | None = field(
        default=None, metadata={"help": "index folder from `corag index`, or a `corag serve-retriever` URL"}
    )
    task: str | None = field(default=None, metadata={"help": "task of the questions (default: their own)"})
    limit: int | None = field(default=None, metadata={"help": "only the first N questions"})
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
    argv = device_flags(sys.argv[1:] if argv is None else argv)
    try:
        from corag.evaluation import parse_runs
        from corag.training.grpo import check_trainer_settings  # refuses a trl it was not tested with

        argv = with_questions_per_step(argv, int(os.environ.get("WORLD_SIZE", "1")))  # as accelerate sets it
        data, rollout, limits, grpo, model = parse_config(CONFIGS, argv, __doc__.splitlines()[0])
        data.check()
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
    model.attn_implementation = attention_implementation(model.attn_implementation)
    return data, rollout, limits, grpo, model


def main(argv: list[str] | None = None) -> int:
    data, rollout, limits, args, model_args = parse_args(argv)
    start_run(args)

    # 1. Resume from the last checkpoint in output_dir unless told otherwise.
    checkpoint = resume_checkpoint(args)

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
        check_reward_data(rollout.terms(), questions, data.questions)
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
    tokenizer = load_tokenizer(model_args, args.trust_remote_code)
    model = load_model(model_args, args.trust_remote_code)

    # 4. Train: chain rollouts, rewards and advantages are ours; the loss, optimizer and checkpoints trl's.
    from corag.training.grpo import ChainGRPOTrainer

    # Slurm's warning before the time limit saves a checkpoint after the step in hand and ends the run.
    near_limit = StopOnWarning()
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
        callbacks=[*data.callbacks(), near_limit],
    )
    result = train(trainer, checkpoint)
    if near_limit.stopped:
        return end_stopped(trainer)

    # 5. A checkpoint AutoModelForCausalLM loads (a LoRA adapter with use_peft).
    save_final(trainer, result, tokenizer, args.output_dir)
    close_processes(trainer)
    logger.info("model saved to %s", args.output_dir)
    return 0


if __name__ == "__main__":
    leave(main())
