"""Three-task SFT of a chain-of-retrieval model (as in the CoRAG paper), top to bottom.

    accelerate launch --config_file configs/accelerate/ddp.yaml recipes/sft.py \
        --config configs/sft/llama3.1-8b-full.yaml [--key value ...]

Chains (the sampling stage's JSONL) become sub-query, sub-answer and final-answer examples (and
learned-stop examples on request); loss falls only on each target and its end-of-turn token. Full
fine-tuning, or LoRA with `use_peft: true`; resumes from the last checkpoint in output_dir; with LoRA,
`merge_lora: true` also writes a merged model to `<output_dir>/merged` that transformers and vLLM load.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import is_torch_bf16_gpu_available
from trl import ModelConfig, SFTConfig, SFTTrainer, TrlParser, get_peft_config

from corag import training
from corag.data.jsonl import write_jsonl

logger = logging.getLogger("corag.sft")


@dataclass
class DataArguments:
    """Where the chains come from and how examples are built from them."""

    chains: str | None = field(default=None, metadata={"help": "chain records JSONL (sampling stage output)"})
    examples: str | None = field(
        default=None,
        metadata={
            "help": "prebuilt prompt/completion JSONL to train on instead of chains (warm start, baselines)"
        },
    )
    corpus: str | None = field(
        default=None, metadata={"help": "corpus (.jsonl/.parquet/dataset folder) for documents"}
    )
    index: str | None = field(
        default=None, metadata={"help": "index folder (`corag index`) to re-retrieve steps without doc ids"}
    )
    min_score: float | None = field(
        default=None,
        metadata={
            "help": "drop chains scored below this (mean log-likelihood of the gold answer given the chain); "
            "default: keep every chain"
        },
    )
    ratio: float = field(
        default=training.DEFAULT_RATIO, metadata={"help": "keep rate of sub-query/sub-answer examples"}
    )
    example_seed: int = field(default=0, metadata={"help": "seed of the ratio draws"})
    stop_examples: bool = field(default=False, metadata={"help": "add learned-stop (Yes/No) examples"})
    chat_template_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": 'extra chat template variables, e.g. {"enable_thinking": false} for Qwen3'},
    )
    merge_lora: bool = field(
        default=False, metadata={"help": "with LoRA, also save a merged model to output_dir/merged"}
    )


def parse_args(argv: list[str] | None = None) -> tuple[DataArguments, SFTConfig, ModelConfig]:
    """Config file plus command-line overrides; an unknown key is an error that names it."""
    parser = TrlParser((DataArguments, SFTConfig, ModelConfig))
    argv = list(sys.argv[1:] if argv is None else argv)
    if not is_torch_bf16_gpu_available() and "--bf16" not in argv:
        # bf16 where the device has it: configs written for GPUs also run (in fp32) on CPU.
        logger.warning("bf16 is not available on this device; training in fp32")
        argv += ["--bf16", "false"]
    bf16_on_cpu = "--bf16" in argv and argv[argv.index("--bf16") + 1 :][:1] == ["true"]
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if (several or bf16_on_cpu) and not torch.cuda.is_available() and "--use_cpu" not in argv:
        # Several processes without GPUs (`accelerate launch --multi_gpu` on CPU): DDP over gloo needs use_cpu,
        # else each process trains alone. bf16 autocast on a CPU (fast with AMX) also needs it.
        argv += ["--use_cpu", "true"]
    try:
        data_args, sft_args, model_args = parser.parse_args_and_config(args=argv)
    except ValueError as e:  # TrlParser's messages name the unknown keys; make them a clean CLI error
        parser.error(str(e))
    if isinstance(data_args.chat_template_kwargs, str):
        data_args.chat_template_kwargs = json.loads(data_args.chat_template_kwargs)
    if model_args.model_name_or_path is None:
        parser.error("`model_name_or_path` is required")
    if data_args.examples is None and None in (data_args.chains, data_args.corpus):
        parser.error("`chains` and `corpus` are required (or prebuilt `examples`)")
    return data_args, sft_args, model_args


def load_retriever(index: str | None) -> Any:
    """The retriever saved in an index folder, by the kind its manifest names (None without a folder)."""
    if index is None:
        return None
    from corag.retrieval.bm25 import BM25Retriever
    from corag.retrieval.dense import load_dense

    loaders = {"bm25": BM25Retriever.load, "dense": load_dense}
    kind = json.loads((Path(index) / "manifest.json").read_text()).get("kind")
    return loaders[kind](index)


def build_examples(
    data_args: DataArguments, tokenizer: Any, model_path: str, out: Path
) -> list[dict[str, Any]]:
    """Examples from the chains, written once to `out` so that other ranks and resumed runs reuse them."""
    settings = {k: v for k, v in asdict(data_args).items() if k not in ("merge_lora", "chat_template_kwargs")}
    recorded = out.with_suffix(".args.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        if not recorded.exists() or json.loads(recorded.read_text()) != settings:
            raise training.InputError(
                "holds examples built with other data settings; use a new output_dir or delete the file",
                file=str(out),
            )
        return training.load_example_file(out)
    if data_args.examples is not None:
        examples = training.load_example_file(data_args.examples)
        recorded.write_text(json.dumps(settings, indent=1))
        write_jsonl(out, examples)
        return examples
    from corag.data.corpus import Corpus

    chains = training.load_chains(data_args.chains, data_args.min_score)
    if not chains:
        if data_args.min_score is None:
            raise training.InputError("holds no chain", file=data_args.chains)
        raise training.InputError(
            f"no chain scores {data_args.min_score} or more", file=data_args.chains, field="min_score"
        )
    logger.info("training on %d chains from %s", len(chains), data_args.chains)
    corpus = Corpus.load(data_args.corpus)
    scorer = None
    if data_args.stop_examples and any(c.prefix_scores is None for c in chains):
        # Records without prefix scores are scored by the model about to be trained (as sampled).
        from corag.settings import EngineSettings

        engine = EngineSettings(chat_template_kwargs=data_args.chat_template_kwargs)
        scorer = training.lm_prefix_scorer(engine.load(model_path))
    examples = training.build_examples(
        chains,
        corpus,
        retriever=load_retriever(data_args.index),
        truncator=training.TokenizerTruncator(tokenizer),
        ratio=data_args.ratio,
        seed=data_args.example_seed,
        stop=data_args.stop_examples,
        prefix_scores=scorer,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps(settings, indent=1))
    write_jsonl(out, examples)
    return examples


def score_only_labelled_positions() -> None:
    """Have trl's fused LM head score only the labelled positions on CPU too, as it does on GPU.

    Off Triton devices trl projects every position through the LM head (to keep shapes fixed for
    compilers), and with prompts of ~1000 tokens and answers of ~5 that is most of a CPU step's work.
    The loss and gradients are the same (tests/recipes/test_sft.py). A trl without the hook is left alone.
    """
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is not None and not getattr(original, "corag_cpu", False):
        patched = lambda device: device.type == "cpu" or original(device)  # noqa: E731
        patched.corag_cpu = True
        trl_utils._use_triton = patched


def main(argv: list[str] | None = None) -> int:
    data_args, sft_args, model_args = parse_args(argv)
    score_only_labelled_positions()
    logging.basicConfig(level=logging.INFO if sft_args.process_index == 0 else logging.WARNING)
    set_seed(sft_args.seed)

    # 1. Resume from the last checkpoint in output_dir unless told otherwise.
    checkpoint = sft_args.resume_from_checkpoint
    if checkpoint is None and os.path.isdir(sft_args.output_dir):
        checkpoint = get_last_checkpoint(sft_args.output_dir)
    if checkpoint:
        logger.info("resuming from %s", checkpoint)

    # 2. Tokenizer; the chat template renders every example, exactly as at inference.
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        trust_remote_code=sft_args.trust_remote_code,
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    # 3. Examples (built on the main process first, then read by the others) and their tokens.
    with sft_args.main_process_first(desc="build examples"):
        examples = build_examples(
            data_args,
            tokenizer,
            model_args.model_name_or_path,
            Path(sft_args.output_dir) / "sft_examples.jsonl",
        )
        dataset = training.tokenize_dataset(
            training.to_dataset(examples),
            tokenizer,
            data_args.chat_template_kwargs,
            sft_args.dataset_num_proc,
        )
    if sft_args.max_length is not None:
        # trl would cut a longer sequence at the end, through its target: drop it instead, and say so.
        too_long = sum(len(ids) > sft_args.max_length for ids in dataset["input_ids"])
        if too_long:
            logger.warning("dropping %d examples longer than max_length %d", too_long, sft_args.max_length)
            dataset = dataset.filter(lambda ex: len(ex["input_ids"]) <= sft_args.max_length)
        if len(dataset) == 0:
            raise training.InputError(
                f"no example fits max_length {sft_args.max_length} (all {too_long} are longer)",
                field="max_length",
            )
    counts = {task: sum(e["task"] == task for e in examples) for task in training.TASKS}
    logger.info("examples: %s; processes: %d", counts, sft_args.world_size)

    # 4. Model in the config's dtype (bf16 for the GPU configs); no KV cache while training.
    dtypes = {
        "auto": "auto",
        None: None,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
        "float32": torch.float32,
    }
    model = AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        dtype=dtypes[model_args.dtype],
        attn_implementation=model_args.attn_implementation,
        trust_remote_code=sft_args.trust_remote_code,
    )
    model.config.use_cache = False

    # 5. Train: trl keeps our labels (target + end of turn) and only truncates, packs and collates.
    trainer = SFTTrainer(
        model=model,
        args=sft_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()

    # 6. Save a checkpoint that AutoModelForCausalLM and vLLM load (a LoRA adapter, merged on request).
    trainer.model.config.use_cache = True
    trainer.save_model(sft_args.output_dir)
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(sft_args.output_dir)
        if model_args.use_peft and data_args.merge_lora:
            merge_lora(sft_args.output_dir, Path(sft_args.output_dir) / "merged")
    trainer.accelerator.wait_for_everyone()
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
    sys.exit(main())
