"""Three-task SFT of a chain-of-retrieval model (as in the CoRAG paper), top to bottom.

    corag build-examples --chains chains.jsonl --corpus CORPUS --tokenizer MODEL --dataset EXAMPLES
    accelerate launch --config_file configs/accelerate/zero3.yaml -m corag.recipes.sft \
        --config configs/sft/llama3.1-8b-full.yaml --dataset EXAMPLES [--key value ...]
    corag train sft --config configs/sft/toy.yaml --dataset EXAMPLES    # one process

(recipes/sft.py, in a checkout, is the same program.)

Launch pairings: 8B full fine-tuning with `zero3.yaml` (DeepSpeed ZeRO-3, `pip install corag[deepspeed]`)
or `fsdp.yaml` (FSDP2), since parameters, gradients and Adam states (~16 bytes a parameter) must be
sharded across the 8 GPUs; LoRA (`qwen3-4b-lora.yaml`) and the toy model with `ddp.yaml` or `single.yaml`.

The examples (sub-query, sub-answer and final-answer, and learned-stop on request) come from a dataset
`corag build-examples` wrote; given `chains` instead, the recipe runs that same step first (one process
builds while the others wait for the finished folder, no collective pending, no file lock across
nodes) into `<output_dir>-examples`. Tokens are computed once, by the first process, and cached beside the
examples; every process memory-maps both. Loss falls only on each
target and its end-of-turn token. Full fine-tuning, or LoRA with `use_peft: true`; resumes from the last
checkpoint in output_dir, so a requeued job goes on where it stopped (on SIGUSR1, Slurm's warning before
the time limit, it saves a checkpoint after the step in hand and exits with status 75); with LoRA, `merge_lora: true`
also writes a merged model to `<output_dir>/merged` that transformers and vLLM load.

On N nodes under Slurm: `sbatch --nodes=N recipes/slurm_train.sh sft zero3 CONFIG [--key value ...]` (one
`accelerate launch` per node, rendezvous at the job's first node). `effective_batch_size` sets the
gradient accumulation from the number of processes, so the batch is the config's on any GPU count.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import types
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer
from trl import ModelConfig, SFTConfig, SFTTrainer, get_peft_config

from corag.config import parse_config
from corag.errors import InputError
from corag.training import dataset as examples_dataset
from corag.training.dataset import ExamplesConfig
from corag.training.recipes import (
    TESTED_TRL,
    StopOnWarning,
    TimeLimitArguments,
    attention_implementation,
    check_trl,
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

logger = logging.getLogger("corag.sft")
PROG = "corag train sft"


@dataclass
class RecipeArguments(TimeLimitArguments):
    """What the recipe takes beside the examples settings (corag.training.dataset.ExamplesConfig, whose
    `dataset` is the examples folder: given, or built there from `chains` and `corpus`, by default at
    <output_dir>-examples) and trl's SFTConfig and ModelConfig."""

    examples: str | None = field(
        default=None,
        metadata={
            "help": "prebuilt prompt/completion JSONL to train on instead of chains (warm start, baselines)"
        },
    )
    merge_lora: bool = field(
        default=False, metadata={"help": "with LoRA, also save a merged model to output_dir/merged"}
    )
    effective_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "examples per optimizer step over all processes: sets gradient_accumulation_steps to "
            "this / (per_device_train_batch_size x processes), whatever the number of GPUs"
        },
    )


CONFIGS = (ExamplesConfig, RecipeArguments, SFTConfig, ModelConfig)


def parse_args(
    argv: list[str] | None = None,
) -> tuple[ExamplesConfig, RecipeArguments, SFTConfig, ModelConfig]:
    """Config file plus command-line overrides (corag.config, as every command); an unknown key is an
    error that names it."""
    argv = device_flags(sys.argv[1:] if argv is None else argv)
    try:
        check_trl()
        data_args, recipe_args, sft_args, model_args = parse_config(CONFIGS, argv, __doc__.splitlines()[0])
        recipe_args.check()
        if isinstance(data_args.chat_template_kwargs, str):
            data_args.chat_template_kwargs = json.loads(data_args.chat_template_kwargs)
    except (ValueError, InputError, ImportError) as e:  # messages name the unknown keys: one CLI error line
        fail(str(e), PROG)
    model_args.attn_implementation = attention_implementation(model_args.attn_implementation)
    apply_effective_batch(recipe_args, sft_args, int(os.environ.get("WORLD_SIZE", "1")))
    if model_args.model_name_or_path is None:
        fail("`model_name_or_path` is required", PROG)
    if data_args.chains is not None and data_args.corpus is None:
        fail("`chains` needs `corpus` (the documents of the examples)", PROG)
    if data_args.chains is None and recipe_args.examples is None and data_args.dataset is None:
        fail("`dataset` (from `corag build-examples`) or `chains` and `corpus` are required", PROG)
    return data_args, recipe_args, sft_args, model_args


def apply_effective_batch(recipe_args: RecipeArguments, sft_args: SFTConfig, world_size: int) -> None:
    """Set gradient_accumulation_steps from `effective_batch_size` for `world_size` processes (the
    WORLD_SIZE accelerate launch sets); a batch that does not divide ends the run in one line."""
    if recipe_args.effective_batch_size is None:
        return
    try:
        sft_args.gradient_accumulation_steps = accumulation_steps(
            recipe_args.effective_batch_size, sft_args.per_device_train_batch_size, world_size
        )
    except InputError as e:
        fail(str(e), PROG)


def accumulation_steps(effective: int, per_device: int, world_size: int) -> int:
    """Gradient accumulation that keeps `effective` examples per optimizer step on `world_size` processes
    (the paper's 256 stays 256 on 8 or 16 GPUs); an InputError when it does not divide."""
    per_step = per_device * world_size
    if effective < 1 or effective % per_step:
        raise InputError(
            f"{effective} is not a multiple of per_device_train_batch_size {per_device} x {world_size} "
            f"process(es) = {per_step}; change one of them",
            field="effective_batch_size",
        )
    return effective // per_step


def first_process() -> bool:
    """Whether this is the run's first process (RANK 0, or no launcher): the one that builds shared files."""
    return int(os.environ.get("RANK", "0")) == 0


def prepare_examples(
    data_args: ExamplesConfig, model_path: str, output_dir: str, examples: str | None = None
) -> Path:
    """The examples dataset folder: as given, or built first from `chains` (or the `examples` JSONL).

    Every process calls this; the first of the run (RANK 0) builds while the others wait for the
    finished dataset, with no collective pending (so no ddp_timeout) and no file lock across nodes;
    a finished dataset is found at once. Documents are cut with the tokenizer of the model being
    trained, which also scores chain prefixes for stop examples.
    """
    out = Path(output_dir)
    target = Path(data_args.dataset) if data_args.dataset else out.with_name(out.name + "-examples")
    if data_args.chains is not None:
        config = replace(data_args, dataset=str(target), tokenizer=model_path, scorer_model=model_path)
        return examples_dataset.build(config, builder=first_process())
    if examples is not None:
        return examples_dataset.from_jsonl(examples, target)
    if examples_dataset.read_manifest(target) is None:
        raise InputError(
            "is not an examples dataset (build one with `corag build-examples`)",
            file=str(target),
            field="dataset",
        )
    return target


def score_only_labelled_positions() -> None:
    """Have trl's fused LM head score only the labelled positions on CPU too, as it does on GPU.

    Off Triton devices trl projects every position through the LM head (to keep shapes fixed for
    compilers), and with prompts of ~1000 tokens and answers of ~5 that is most of a CPU step's work.
    The switch is `_use_triton(device)`, which `add_fused_lm_head`'s forward looks up in trl.trainer.utils
    at every call; it is private, so this checks that trl still reads it there and fails loudly if not.
    The loss and gradients are the same, and only labelled rows reach the LM head
    (tests/recipes/test_sft.py).
    """
    import trl
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    fused = getattr(trl_utils, "add_fused_lm_head", None)
    if not callable(original) or fused is None or not _reads_global(fused, "_use_triton"):
        raise RuntimeError(
            f"trl {trl.__version__} no longer switches its fused LM head with trl.trainer.utils._use_triton: "
            "update score_only_labelled_positions in corag/recipes/sft.py (or install trl "
            f"{TESTED_TRL}.x, which it was written for)"
        )
    if not getattr(original, "corag_cpu", False):
        patched = lambda device: device.type == "cpu" or original(device)  # noqa: E731
        patched.corag_cpu = True
        trl_utils._use_triton = patched


def _reads_global(function: Any, name: str) -> bool:
    """Whether `function` (or a function defined inside it) reads the module-level `name` of its module."""
    if function.__globals__.get(name) is None:
        return False
    codes = [function.__code__]
    while codes:
        code = codes.pop()
        if name in code.co_names:
            return True
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return False


def main(argv: list[str] | None = None) -> int:
    data_args, recipe_args, sft_args, model_args = parse_args(argv)
    if sft_args.use_cpu or not torch.cuda.is_available():
        score_only_labelled_positions()
    start_run(sft_args)
    logger.info(
        "effective batch: %d per device x %d accumulation x %d processes",
        sft_args.per_device_train_batch_size,
        sft_args.gradient_accumulation_steps,
        sft_args.world_size,
    )

    # 1. Resume from the last checkpoint in output_dir unless told otherwise.
    checkpoint = resume_checkpoint(sft_args)

    # 2. Tokenizer; the chat template renders every example, exactly as at inference.
    tokenizer = load_tokenizer(model_args, sft_args.trust_remote_code)

    # 3. Examples: built once (or found built), then tokenized once; every process memory-maps both.
    dataset_dir = prepare_examples(
        data_args, model_args.model_name_or_path, sft_args.output_dir, recipe_args.examples
    )
    dataset = examples_dataset.tokenized(
        dataset_dir, tokenizer, data_args.chat_template_kwargs, sft_args.max_length, sft_args.dataset_num_proc,
        builder=first_process(),
    )  # fmt: skip
    if sft_args.padding_free and not sft_args.packing:
        sft_args.max_length = None  # longer examples were dropped above; trl refuses a cap it does not apply
    logger.info(
        "%d examples from %s (built: %s); processes: %d",
        len(dataset),
        dataset_dir,
        examples_dataset.read_manifest(dataset_dir)["tasks"],
        sft_args.world_size,
    )

    # 4. Model in the config's dtype (bf16 for the GPU configs); no KV cache while training.
    model = load_model(model_args, sft_args.trust_remote_code)
    model.config.use_cache = False

    # 5. Train: trl keeps our labels (target + end of turn) and only truncates, packs and collates. Slurm's
    # warning before the time limit saves a checkpoint after the step in hand and ends the run there.
    near_limit = StopOnWarning()
    trainer = SFTTrainer(
        model=model,
        args=sft_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=[*recipe_args.callbacks(), near_limit],
    )
    result = train(trainer, checkpoint)
    if near_limit.stopped:
        return end_stopped(trainer)

    # 6. Save a checkpoint that AutoModelForCausalLM and vLLM load (a LoRA adapter, merged on request).
    # FSDP checkpoints are sharded during training (fsdp_state_dict_type: SHARDED_STATE_DICT: each rank
    # writes its own shard, nothing gathered); the final save gathers one full state dict, as accelerate
    # documents for this case.
    trainer.model.config.use_cache = True
    if trainer.is_fsdp_enabled:
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    save_final(trainer, result, tokenizer, sft_args.output_dir)
    if trainer.accelerator.is_main_process and model_args.use_peft and recipe_args.merge_lora:
        merge_lora(sft_args.output_dir, Path(sft_args.output_dir) / "merged")
    close_processes(trainer)
    logger.info("model saved to %s", sft_args.output_dir)
    return 0


def merge_lora(adapter_dir: str | Path, out: str | Path) -> None:
    """Fold a saved LoRA adapter into its base model and save the result with the tokenizer."""
    from peft import AutoPeftModelForCausalLM

    model = AutoPeftModelForCausalLM.from_pretrained(adapter_dir, dtype="auto").merge_and_unload()
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(adapter_dir).save_pretrained(out)
    logger.info("merged model saved to %s", out)


if __name__ == "__main__":
    leave(main())
