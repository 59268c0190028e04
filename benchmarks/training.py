"""Training throughput: BFD packing (padding-free rows) against plain padded batches, same data and model.

Toy-world chains with their documents re-retrieved by BM25 (top 5 per step, top 20 per question), so the
examples have the spread of lengths the real three-task mix has (short sub-query prompts, long final-answer
prompts). Both runs train one epoch of the same examples from the same tiny Llama with trl's SFTTrainer
(its training step, collator and packing), their steps interleaved so that load on a shared machine hits
both alike. Tokens/s counts real (non-padding) tokens.
The last printed line is JSON: speedup (packed over padded tokens/s), and the final losses of both.

    python benchmarks/training.py [--entities 80] [--examples 128] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from corag import training  # noqa: E402
from corag.data.corpus import Corpus  # noqa: E402
from corag.data.toyworld import generate_world, tokenizer_texts  # noqa: E402
from corag.retrieval.bm25 import BM25Retriever  # noqa: E402
from corag.tinymodel import build_tiny_model, train_tokenizer  # noqa: E402
from corag.types import Step  # noqa: E402


def build_dataset(entities: int, seed: int, size: int, out: Path):
    """Tokenized three-task examples from the toy world's gold chains, documents re-retrieved."""
    world = generate_world(
        seed=seed, num_entities=entities, num_distractors=entities // 4, train_per_hop=entities // 2
    )
    world.write(out / "world")
    corpus = Corpus.load(out / "world" / "corpus.jsonl")
    tokenizer = train_tokenizer(tokenizer_texts(world))
    chains = [
        training.ChainRecord(
            ex.id, ex.query, ex.answers, tuple(Step(s.subquery, s.subanswer) for s in ex.decomposition)
        )
        for ex in world.train
    ]
    examples = training.build_examples(
        chains,
        corpus,
        retriever=BM25Retriever.from_passages(world.passages),
        truncator=training.TokenizerTruncator(tokenizer),
        seed=seed,
    )
    examples = random.Random(seed).sample(examples, min(size, len(examples)))
    dataset = training.tokenize_dataset(training.to_dataset(examples), tokenizer)
    return tokenizer, dataset.remove_columns(["prompt", "completion", "task", "id"])


def trainer_for(tokenizer, dataset, out: Path, seed: int, **config) -> SFTTrainer:
    """trl's SFTTrainer as the recipe builds it, around a fresh tiny Llama (same seed, same weights)."""
    args = SFTConfig(
        output_dir=str(out),
        report_to="none",
        bf16=False,
        activation_checkpointing=False,
        completion_only_loss=True,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        seed=seed,
        dataloader_num_workers=0,
        **config,
    )
    return SFTTrainer(
        model=build_tiny_model(tokenizer, seed=seed),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )


def interleaved_epoch(runs: dict[str, tuple[SFTTrainer, int]]) -> dict[str, dict]:
    """One epoch of each trainer, their optimizer steps interleaved so that a busy machine slows both alike.

    Each micro-batch goes through trl's own training step (forward, loss over the target tokens, backward);
    the optimizer steps after `accumulation` micro-batches (runs map a name to (trainer, accumulation)).
    """
    stats = {}
    for name, (trainer, accumulation) in runs.items():
        trainer.create_optimizer_and_scheduler(num_training_steps=len(trainer.get_train_dataloader()))
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = accumulation  # set by train(), which this loop replaces
        stats[name] = {
            "batches": iter(trainer.get_train_dataloader()),
            "seconds": 0.0,
            "tokens": 0,
            "slots": 0,
            "losses": [],
        }
    active = set(runs)
    while active:
        for name in sorted(active):
            (trainer, accumulation), s = runs[name], stats[name]
            batches = [b for b in (next(s["batches"], None) for _ in range(accumulation)) if b is not None]
            if not batches:
                active.discard(name)
                continue
            start = time.perf_counter()
            loss = sum(float(trainer.training_step(trainer.model, batch)) for batch in batches)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad()
            s["seconds"] += time.perf_counter() - start
            for batch in batches:
                mask = batch.get("attention_mask")
                s["tokens"] += int(mask.sum()) if mask is not None else batch["input_ids"].numel()
                s["slots"] += batch["input_ids"].numel()
            s["losses"].append(loss * accumulation / len(batches))
    return {
        name: {
            "tokens_per_s": s["tokens"] / s["seconds"],
            "seconds": s["seconds"],
            "steps": len(s["losses"]),
            "padding_efficiency": s["tokens"] / s["slots"],
            "final_loss": sum(s["losses"][-3:]) / 3,
        }
        for name, s in stats.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entities", type=int, default=80)
    ap.add_argument("--examples", type=int, default=128, help="examples trained (a seeded sample)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=8, help="padded batch size")
    ap.add_argument(
        "--row", type=int, default=1024, help="packed row length (tokens); keep it near the longest example"
    )
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 keeps timings steady on a busy machine)"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokenizer, dataset = build_dataset(args.entities, args.seed, args.examples, tmp)
        lengths = sorted(len(ids) for ids in dataset["input_ids"])
        mean = sum(lengths) / len(lengths)
        padded = trainer_for(
            tokenizer,
            dataset,
            tmp / "padded",
            args.seed,
            per_device_train_batch_size=args.batch_size,
            packing=False,
            max_length=max(lengths),
        )
        packed = trainer_for(
            tokenizer,
            dataset,
            tmp / "packed",
            args.seed,
            per_device_train_batch_size=1,
            packing=True,
            max_length=args.row,
        )
        # About the same number of real tokens per optimizer step in both runs.
        accumulation = max(1, round(args.batch_size * mean / args.row))
        results = interleaved_epoch({"padded": (padded, 1), "packed": (packed, accumulation)})
        padded, packed = results["padded"], results["packed"]
    print(f"{len(lengths)} examples, tokens min/mean/max {lengths[0]}/{mean:.0f}/{lengths[-1]}")
    for name, run in (("padded", padded), ("packed", packed)):
        print(
            f"{name}: {run['tokens_per_s']:.0f} tokens/s, {run['steps']} steps, {run['seconds']:.1f} s, "
            f"final loss {run['final_loss']:.3f}"
        )
    print(
        json.dumps(
            {
                "speedup": round(packed["tokens_per_s"] / padded["tokens_per_s"], 3),
                "final_loss_packed": round(packed["final_loss"], 4),
                "final_loss_padded": round(padded["final_loss"], 4),
                "tokens_per_s_packed": round(packed["tokens_per_s"], 1),
                "tokens_per_s_padded": round(padded["tokens_per_s"], 1),
                "padding_efficiency_padded": round(padded["padding_efficiency"], 3),
                "examples": len(lengths),
                "mean_tokens": round(mean, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
