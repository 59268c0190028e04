"""Training data path and throughput.

1. Batches: padding-free batches (a batch's examples laid end to end in one row, as the 8B configs train)
   and BFD packing, each against plain padded batches, same data and model. Toy-world chains with their
   documents re-retrieved by BM25 (top 5 per step, top 20 per question), so the examples have the spread
   of lengths the real three-task mix has (short sub-query prompts, long final-answer prompts). The runs
   train one epoch of the same examples from the same tiny Llama with trl's SFTTrainer (its training
   step, collator and packing), their steps interleaved so that load on a shared machine hits them alike.
   Tokens/s counts real (non-padding) tokens.
2. Examples: `corag build-examples` on synthetic chains (`--chains`, default 100k, and a tenth of it), each
   in its own process: seconds and peak RSS, which should not grow with the number of chains.

The last printed line is JSON: speedups over padded tokens/s, final losses, and the examples step's
seconds and peak RSS at both sizes.

    python benchmarks/training.py [--entities 80] [--examples 128] [--chains 100000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from corag.data.corpus import Corpus  # noqa: E402
from corag.retrieval.bm25 import BM25Retriever  # noqa: E402
from corag.toy.tinymodel import build_tiny_model, train_tokenizer  # noqa: E402
from corag.toy.world import generate_world, tokenizer_texts  # noqa: E402
from corag.training import examples as sft  # noqa: E402
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
        sft.ChainRecord(
            ex.id, ex.query, ex.answers, tuple(Step(s.subquery, s.subanswer) for s in ex.decomposition)
        )
        for ex in world.train
    ]
    examples = sft.build_examples(
        chains,
        corpus,
        retriever=BM25Retriever.from_passages(world.passages),
        truncator=sft.TokenizerTruncator(tokenizer),
        seed=seed,
    )
    examples = random.Random(seed).sample(examples, min(size, len(examples)))
    dataset = sft.tokenize_dataset(sft.to_dataset(examples), tokenizer)
    return tokenizer, dataset.select_columns(["input_ids", "labels"])


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


def synthetic_inputs(num_chains: int, out: Path, seed: int, passages: int = 20000) -> tuple[Path, Path]:
    """A corpus of `passages` passages of 100 toy-world words (as long as KILT's) and `num_chains` chain
    records as `corag sample` writes them (1-4 steps, five doc ids per step, twenty context ids)."""
    rng = random.Random(seed)
    words = sorted(
        {w for p in generate_world(seed=seed, num_entities=80).passages for w in p.contents.split()}
    )
    corpus = out / "corpus.jsonl"
    with open(corpus, "w") as f:
        for i in range(passages):
            text = " ".join(rng.choices(words, k=100))
            f.write(json.dumps({"id": str(i), "title": f"Title {i}", "contents": text}) + "\n")
    chains = out / f"chains-{num_chains}.jsonl"
    with open(chains, "w") as f:
        for i in range(num_chains):
            steps = [
                {
                    "subquery": " ".join(rng.choices(words, k=8)) + "?",
                    "subanswer": " ".join(rng.choices(words, k=3)),
                    "doc_ids": [str(rng.randrange(passages)) for _ in range(5)],
                }
                for _ in range(rng.randint(1, 4))
            ]
            record = {
                "query_id": f"q{i}",
                "query": " ".join(rng.choices(words, k=12)) + "?",
                "answers": [" ".join(rng.choices(words, k=2))],
                "context_doc_ids": [str(rng.randrange(passages)) for _ in range(20)],
                "subqueries": [s["subquery"] for s in steps],
                "subanswers": [s["subanswer"] for s in steps],
                "steps": steps,
                "score": -0.5,
            }
            f.write(json.dumps(record) + "\n")
    return corpus, chains


BUILD = """
import json, sys, time
from corag.training import dataset
start = time.perf_counter()
dataset.build(dataset.ExamplesConfig(chains=sys.argv[1], corpus=sys.argv[2], dataset=sys.argv[3],
                                       tokenizer=sys.argv[4] or None, num_proc=int(sys.argv[5])))
# VmHWM: this process's own peak (getrusage's maxrss would include the parent's size before exec)
rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"seconds": time.perf_counter() - start, "peak_rss_mb": rss / 1024,
                  "examples": dataset.read_manifest(sys.argv[3])["examples"]}))
"""


def examples_step(
    num_chains: int, tmp: Path, seed: int, tokenizer_dir: Path | None, num_proc: int = 1
) -> dict[str, dict]:
    """`corag build-examples` at a tenth of `num_chains` and at `num_chains`, each in a fresh process."""
    results = {}
    for n in (num_chains // 10, num_chains):
        corpus, chains = synthetic_inputs(n, tmp, seed)
        Corpus.load(corpus)  # the store is prepared once, as before any real build
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        args = [sys.executable, "-c", BUILD, str(chains), str(corpus), str(tmp / f"examples-{n}")]
        done = subprocess.run(
            [*args, str(tokenizer_dir or ""), str(num_proc)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-3000:])
        results[str(n)] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"build-examples, {n} chains: {results[str(n)]}")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entities", type=int, default=80)
    ap.add_argument("--examples", type=int, default=128, help="examples trained (a seeded sample)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=8, help="padded and padding-free batch size")
    ap.add_argument(
        "--row", type=int, default=1024, help="packed row length (tokens); keep it near the longest example"
    )
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 keeps timings steady on a busy machine)"
    )
    ap.add_argument("--chains", type=int, default=100_000, help="synthetic chains for the examples step")
    ap.add_argument(
        "--build-proc", type=int, default=1, help="processes of the examples step (RSS is the main one's)"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokenizer, dataset = build_dataset(args.entities, args.seed, args.examples, tmp)
        lengths = sorted(len(ids) for ids in dataset["input_ids"])
        mean = sum(lengths) / len(lengths)
        batched = dict(per_device_train_batch_size=args.batch_size, packing=False, max_length=max(lengths))
        padded = trainer_for(tokenizer, dataset, tmp / "padded", args.seed, **batched)
        free = trainer_for(
            tokenizer, dataset, tmp / "free", args.seed, padding_free=True, **batched | {"max_length": None}
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
        # About the same number of real tokens per optimizer step in every run.
        accumulation = max(1, round(args.batch_size * mean / args.row))
        runs = {"padded": (padded, 1), "padding_free": (free, 1), "packed": (packed, accumulation)}
        results = interleaved_epoch(runs)
        tokenizer.save_pretrained(tmp / "tokenizer")
        built = examples_step(args.chains, tmp, args.seed, tmp / "tokenizer", args.build_proc)
    print(f"{len(lengths)} examples, tokens min/mean/max {lengths[0]}/{mean:.0f}/{lengths[-1]}")
    for name, run in results.items():
        print(
            f"{name}: {run['tokens_per_s']:.0f} tokens/s, {run['steps']} steps, {run['seconds']:.1f} s, "
            f"final loss {run['final_loss']:.3f}"
        )
    padded, free, packed = results["padded"], results["padding_free"], results["packed"]
    small, large = built[str(args.chains // 10)], built[str(args.chains)]
    print(
        json.dumps(
            {
                "speedup": round(packed["tokens_per_s"] / padded["tokens_per_s"], 3),
                "speedup_padding_free": round(free["tokens_per_s"] / padded["tokens_per_s"], 3),
                "final_loss_packed": round(packed["final_loss"], 4),
                "final_loss_padding_free": round(free["final_loss"], 4),
                "final_loss_padded": round(padded["final_loss"], 4),
                "tokens_per_s_packed": round(packed["tokens_per_s"], 1),
                "tokens_per_s_padding_free": round(free["tokens_per_s"], 1),
                "tokens_per_s_padded": round(padded["tokens_per_s"], 1),
                "padding_efficiency_padded": round(padded["padding_efficiency"], 3),
                "examples": len(lengths),
                "mean_tokens": round(mean, 1),
                "build_chains": args.chains,
                "build_proc": args.build_proc,
                "build_examples": large["examples"],
                "build_seconds": round(large["seconds"], 1),
                "build_peak_rss_mb": round(large["peak_rss_mb"]),
                "build_peak_rss_mb_tenth": round(small["peak_rss_mb"]),
                "build_rss_growth": round(large["peak_rss_mb"] / small["peak_rss_mb"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
