"""The toy-world reproduction: the whole CoRAG study on a CPU for three seeds.

One warm-start model (trained from scratch on fresh worlds, the stand-in for an instruct model) is
shared by the seeds; for each seed a new target world is built, chains are rejection-sampled for its
training questions, the warm model is fine-tuned on them (CoRAG) and, with the same questions and
steps, on the question's top documents alone (the single-step baseline), and every method is
evaluated on held-out questions (entities never seen in training questions). Prints EM on 3-hop
questions and tokens per question by method, mean and spread over seeds; the last line is JSON.

    python benchmarks/toyworld.py [--config STUDY.yaml] [--seeds 0 1 2] [--out runs/toyworld]

Without --config the study runs at corag.toystudy.StudyConfig's defaults (the full size).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

from corag.config import load_yaml
from corag.toystudy import StudyConfig, run_study

METHODS = [
    "no_retrieval",
    "single_step",
    "corag_greedy",
    "corag_best_of_4",
    "corag_tree",
    "ircot",
    "searchain",
]


def spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 2),
        "std": round(statistics.pstdev(values), 2),
        "values": [round(v, 2) for v in values],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="YAML of StudyConfig fields (default: its defaults)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/toyworld")
    args = parser.parse_args()
    base = StudyConfig(**load_yaml(args.config)) if args.config else StudyConfig()
    start = time.perf_counter()
    per_seed = []
    warm = None
    for seed in args.seeds:
        cfg = replace(base, seed=seed, out_dir=f"{args.out}/seed{seed}", warm_dir=warm)
        summary = run_study(cfg)
        warm = warm or str(Path(cfg.out_dir) / "models" / "warm")
        per_seed.append(summary["results"])
    em = {
        m: spread([r[m]["em_by_hops"].get("3", 0.0) for r in per_seed]) for m in METHODS if m in per_seed[0]
    }
    tokens = {m: spread([r[m]["tokens_per_question"] for r in per_seed]) for m in METHODS if m in per_seed[0]}
    for m in em:
        print(
            f"{m:16s} EM 3-hop {em[m]['mean']:5.1f} ± {em[m]['std']:4.1f}   tokens/q {tokens[m]['mean']:8.0f}"
        )
    print(json.dumps({
        "em_3hop": {m: v["mean"] for m, v in em.items()},
        "em_3hop_spread": em,
        "tokens_per_question": {m: v["mean"] for m, v in tokens.items()},
        "seeds": args.seeds,
        "wall_s": round(time.perf_counter() - start, 1),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
