"""Rejection-sampling throughput: the batched sampler against one question at a time.

Toy-world training questions, the tiny Llama (trained a few steps so it ends its turns), BM25, CPU.
Both runs sample the same chains (4 per question, lengths 1..3); the batched run keeps every question
in flight at once, the baseline one (its own chains still batched together, as a question issues
them). Reports chains/s of both, whether the two outputs are byte-identical, and the share of the
batched run's time spent scoring (gold-answer likelihoods) and the share of prompt tokens that identical
calls computed once saved (`dedup_saved_share`; benchmarks/engine.py checks the records do not change).
The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from corag.data.corpus import Corpus
from corag.lm import load_lm
from corag.lm.base import WrappedLM
from corag.retrieval.bm25 import BM25Retriever
from corag.sampling import SamplingConfig, run_sampling
from corag.toy.tinymodel import build_tiny_model, save_tiny, teach_turn_ends, train_tokenizer
from corag.toy.world import generate_world, tokenizer_texts


class TimedLM(WrappedLM):
    """Passes calls to a real LM and adds up the seconds spent in generate and in score."""

    def __init__(self, lm: Any) -> None:
        super().__init__(lm)
        self.seconds = {"generate": 0.0, "score": 0.0}

    def generate(self, requests):
        start = time.perf_counter()
        out = self.lm.generate(requests)
        self.seconds["generate"] += time.perf_counter() - start
        return out

    def score(self, requests):
        start = time.perf_counter()
        out = self.lm.score(requests)
        self.seconds["score"] += time.perf_counter() - start
        return out


def same_chains(a: bytes, b: bytes) -> bool:
    """The same chains for every question, scores equal to 1e-4. Bit-equality is only promised for
    equal blocks: batches of other shapes change the last float bits of the scores."""

    def key(line: bytes) -> tuple:
        record = json.loads(line)
        return record["query_id"], record["subqueries"], record["subanswers"], record["steps"]

    rows_a, rows_b = a.splitlines(), b.splitlines()
    return len(rows_a) == len(rows_b) and all(
        key(x) == key(y) and abs(json.loads(x)["score"] - json.loads(y)["score"]) < 1e-4
        for x, y in zip(rows_a, rows_b, strict=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both runs alike)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    world = generate_world(seed=0, num_entities=160, num_distractors=40, train_per_hop=30, test_per_hop=5)
    folder = Path(tempfile.mkdtemp(prefix="corag-bench-sampling-"))
    world.write(folder / "world")
    tokenizer = train_tokenizer(tokenizer_texts(world))
    model = build_tiny_model(tokenizer, seed=0)
    teach_turn_ends(model, tokenizer, world, steps=30)
    lm = TimedLM(load_lm(save_tiny(folder / "model", model, tokenizer), device="cpu"))
    corpus = Corpus.load(folder / "world" / "corpus.jsonl")
    retriever = BM25Retriever.from_passages(world.passages)
    questions = world.train[: args.questions]
    config = SamplingConfig(num_chains=args.chains, max_length=3, seed=0)

    runs = {}
    for label, block_size in (("batched", args.questions), ("one_at_a_time", 1)):
        lm.seconds = {"generate": 0.0, "score": 0.0}
        out = folder / f"{label}.jsonl"
        start = time.perf_counter()
        summary = run_sampling(
            questions, corpus, lm, retriever, config, out, block_size=block_size, progress=False
        )
        wall = time.perf_counter() - start
        runs[label] = {
            "wall": wall,
            "seconds": dict(lm.seconds),
            "bytes": out.read_bytes(),
            "summary": summary,
        }
        chains_s = len(questions) * args.chains / wall
        print(
            f"{label:14s} {chains_s:7.2f} chains/s ({wall:6.1f} s; generate {lm.seconds['generate']:.1f} s, "
            f"score {lm.seconds['score']:.1f} s; mean tokens/question {summary['mean_tokens_per_question']:.0f})"
        )
    batched, single = runs["batched"], runs["one_at_a_time"]
    print(json.dumps({
        "speedup": round(single["wall"] / batched["wall"], 2),
        "identical": same_chains(batched["bytes"], single["bytes"]),
        "byte_identical": batched["bytes"] == single["bytes"],
        "scoring_share": round(batched["seconds"]["score"] / batched["wall"], 3),
        "dedup_saved_share": round(batched["summary"]["dedup_saved_share"], 4),
        "chains_per_s": round(len(questions) * args.chains / batched["wall"], 2),
        "chains_per_s_one_at_a_time": round(len(questions) * args.chains / single["wall"], 2),
        "questions": len(questions),
        "chains_per_question": args.chains,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
