"""Decoding throughput: the batching executor against one question at a time, same strategy, same model.

64 toy-world questions, the tiny Llama (trained for a few steps so it ends its turns), BM25, CPU.
For greedy (L=3), best-of-4 and tree search it reports questions/s with the executor coalescing all
questions' calls (max_active=256) and with max_active=1 (each question's own calls still batched, as
a strategy issues them), and whether both give identical chains and predictions. Tree search one at a
time is slow, so its baseline runs the first `--tree-baseline` questions. Speed-ups are given in
wall-clock time and in process CPU time (torch on one thread): on a shared machine the CPU-time ratio
is the steadier one. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from corag.chain import DecodeResult
from corag.data.corpus import Corpus
from corag.decoding import STRATEGIES
from corag.executor import Executor
from corag.lm import load_lm
from corag.retrieval.bm25 import BM25Retriever
from corag.toy.tinymodel import build_tiny_model, save_tiny, teach_turn_ends, train_tokenizer
from corag.toy.world import generate_world, tokenizer_texts


def timed(lm: Any, retriever: Any, corpus: Corpus, questions: list, name: str, max_active: int, **kw: Any):
    executor = Executor(lm, retriever, max_active=max_active)
    strategy = STRATEGIES[name]
    start, cpu = time.perf_counter(), time.process_time()
    results: list[DecodeResult] = executor.run(
        [strategy(executor.context(), q, corpus, **kw) for q in questions]
    )
    stats = executor.dedup_stats
    batches = {
        **executor.batches,
        "dedup_saved_share": stats["saved_prompt_tokens"] / max(stats["prompt_tokens"], 1),
    }
    return results, time.perf_counter() - start, time.process_time() - cpu, batches


def same(a: list[DecodeResult], b: list[DecodeResult]) -> bool:
    return [(r.steps, r.prediction) for r in a] == [(r.steps, r.prediction) for r in b]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both sides alike)")
    parser.add_argument(
        "--tree-baseline", type=int, default=16, help="questions tree search runs one at a time (slow)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    world = generate_world(seed=0, num_entities=160, num_distractors=40, train_per_hop=30, test_per_hop=25)
    questions = world.test[: args.questions]
    assert len(questions) == args.questions, f"the world has only {len(world.test)} test questions"
    folder = Path(tempfile.mkdtemp(prefix="corag-bench-decoding-"))
    world.write(folder / "world")
    tokenizer = train_tokenizer(tokenizer_texts(world))
    model = build_tiny_model(tokenizer, seed=0)
    teach_turn_ends(model, tokenizer, world, args.train_steps)
    lm = load_lm(save_tiny(folder / "model", model, tokenizer), backend="hf", device="cpu")
    corpus = Corpus.load(folder / "world" / "corpus.jsonl")
    retriever = BM25Retriever.from_passages(world.passages)
    print(
        f"{len(questions)} questions, {len(world.passages)} passages, L={args.max_steps}, threads={args.threads}"
    )

    figures: dict[str, Any] = {}
    for label, name, kw, baseline in [
        ("greedy", "greedy", {}, len(questions)),
        ("best_of_4", "best_of_n", {"n": 4}, len(questions)),
        ("tree_search", "tree_search", {}, min(args.tree_baseline, len(questions))),
    ]:
        kw = {"max_steps": args.max_steps, **kw}
        batched, wall_b, cpu_b, batches = timed(lm, retriever, corpus, questions, name, 256, **kw)
        single, wall_s, cpu_s, _ = timed(lm, retriever, corpus, questions[:baseline], name, 1, **kw)
        qps_b, qps_s = len(questions) / wall_b, baseline / wall_s
        cpu_ratio = (cpu_s / baseline) / (cpu_b / len(questions))
        identical = same(batched[:baseline], single)
        tokens = sum(r.usage.total for r in batched) / len(batched)
        print(
            f"{label:11s} executor {qps_b:6.2f} q/s ({len(questions)} q, {wall_b:6.1f} s, {cpu_b:6.1f} cpu-s, "
            f"backend calls {batches}) | one at a time {qps_s:6.2f} q/s ({baseline} q, {wall_s:6.1f} s, "
            f"{cpu_s:6.1f} cpu-s) | speed-up {qps_b / qps_s:5.1f}x wall, {cpu_ratio:5.1f}x cpu | "
            f"identical {identical} | tokens/q {tokens:.0f}"
        )
        figures[f"{label}_speedup"] = round(qps_b / qps_s, 2)
        figures[f"{label}_cpu_speedup"] = round(cpu_ratio, 2)
        figures[f"{label}_identical"] = identical
        figures[f"{label}_dedup_saved_share"] = round(batches.pop("dedup_saved_share"), 4)
        figures[f"{label}_qps"] = round(qps_b, 3)
        figures[f"{label}_qps_one_at_a_time"] = round(qps_s, 3)
        figures[f"{label}_baseline_questions"] = baseline
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
