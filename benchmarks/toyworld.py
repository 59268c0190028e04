"""The toy-world reproduction: the whole CoRAG study on a CPU for three seeds.

One warm-start model (trained from scratch on fresh worlds, the stand-in for an instruct model) is
shared by the seeds; for each seed a new target world is built, chains are rejection-sampled for its
training questions, the warm model is fine-tuned on those that reach the answer (CoRAG) and, on the
same sampled questions for as many steps, on the question's top documents alone (the single-step
baseline), and every method is evaluated on held-out 2- and 3-hop questions (entities never seen in
training questions). The seeds run as
parallel processes (`--jobs`, one thread each by default). Prints EM on 3-hop questions and tokens per
question by method, mean and spread over seeds, each call's accuracy on gold inputs (the study's
diagnosis) and how well best-of-4's penalty picked among its chains; the last line is JSON.

    python benchmarks/toyworld.py [--config STUDY.yaml] [--seeds 0 1 2] [--jobs 3] [--out runs/toyworld]

Without --config the study runs at corag.toy.study.StudyConfig's defaults (the full size). A rerun
resumes: finished stages are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from corag.config import load_yaml
from corag.scaling import pareto_frontier, plot_scaling
from corag.toy.study import JUDGE_COUNTS, StudyConfig, compute_dtype, warm_start

METHODS = [
    "no_retrieval",
    "single_step",
    "corag_greedy",
    "warm_greedy",
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


def run_seeds(args: argparse.Namespace, warm: Path) -> list[dict]:
    """One `corag toystudy` process per seed, `args.jobs` at a time; their summaries in seed order."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    pending, running = list(args.seeds), []
    while pending or running:
        while pending and len(running) < args.jobs:
            seed = pending.pop(0)
            out = Path(args.out) / f"seed{seed}"
            command = [sys.executable, "-m", "corag.cli", "toystudy", "--seed", str(seed)]
            command += ["--out_dir", str(out), "--warm_dir", str(warm)]
            command += ["--config", args.config] if args.config else []
            out.mkdir(parents=True, exist_ok=True)
            print(f"seed {seed}: {' '.join(command[1:])} (log: {out / 'study.log'})", flush=True)
            with (out / "study.log").open("a") as log:  # the child keeps its own handle
                running.append(
                    (seed, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
                )
        time.sleep(2)
        for seed, proc in list(running):
            if proc.poll() is not None:
                running.remove((seed, proc))
                if proc.returncode:
                    raise SystemExit(f"seed {seed} failed (rc {proc.returncode}); see its study.log")
                print(f"seed {seed}: done", flush=True)
    return [json.loads((Path(args.out) / f"seed{s}" / "summary.json").read_text()) for s in args.seeds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="YAML of StudyConfig fields (default: its defaults)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=3, help="seeds run at once")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per seed process")
    parser.add_argument("--out", default="runs/toyworld")
    args = parser.parse_args()
    base = StudyConfig(**load_yaml(args.config)) if args.config else StudyConfig()
    start = time.perf_counter()
    warm = Path(args.out) / "warm"
    if not (warm / "config.json").exists():
        print("warm start (shared by the seeds) ...", flush=True)
        warm_start(replace(base, seed=args.seeds[0]), warm)
    warm_s = time.perf_counter() - start
    summaries = run_seeds(args, warm)
    report(args, base, warm, summaries, time.perf_counter() - start, warm_s)


def call_accuracy_3hop(summaries: list[dict]) -> dict[str, dict[str, float]]:
    """Each call's accuracy on gold inputs, 3-hop validation questions, mean over seeds, by model."""
    scored = [s["call_accuracy"] for s in summaries if "call_accuracy" in s]
    if not scored or any("3hop" not in by_hops for by_hops in scored[0].values()):
        return {}
    return {
        model: {key: round(statistics.fmean(s[model]["3hop"][key] for s in scored), 4) for key in first}
        for model, first in ((model, by_hops["3hop"]) for model, by_hops in scored[0].items())
    }


def judge_3hop(per_seed: list[dict], label: str = "corag_best_of_4") -> dict[str, float]:
    """Best-of-4's judge on 3-hop questions, counts summed over seeds (corag.toy.study.judge_headroom)."""
    judged = [r[label]["judge"]["3"] for r in per_seed if "3" in r.get(label, {}).get("judge", {})]
    if not judged:
        return {}
    out = {key: sum(j[key] for j in judged) for key in JUDGE_COUNTS}
    pairs = sum(j["pairs"] for j in judged)
    ranked = sum(j["right_first"] * j["pairs"] for j in judged if j["pairs"])
    return {**out, "pairs": pairs, "right_first": round(ranked / pairs, 3) if pairs else None}


def report(
    args: argparse.Namespace,
    base: StudyConfig,
    warm: Path,
    summaries: list[dict],
    wall_s: float,
    warm_s: float,
) -> None:
    """Print the tables (mean ± spread over seeds), write the mean scaling plot, print the JSON line."""
    per_seed = [summary["results"] for summary in summaries]
    methods = [m for m in per_seed[0] if all(m in r for r in per_seed)]
    hops = sorted({h for r in per_seed for m in methods for h in r[m]["em_by_hops"]}, key=int)
    em = {m: {h: spread([r[m]["em_by_hops"].get(h, 0.0) for r in per_seed]) for h in hops} for m in methods}
    em_all = {m: spread([r[m]["em"] for r in per_seed]) for m in methods}
    tokens = {m: spread([r[m]["tokens_per_question"] for r in per_seed]) for m in methods}
    print(f"{'method':20s} " + " ".join(f"{h}-hop EM".rjust(14) for h in hops) + "   all EM   tokens/q")
    for m in methods:
        cells = " ".join(f"{em[m][h]['mean']:6.1f} ± {em[m][h]['std']:4.1f}" for h in hops)
        print(f"{m:20s} {cells}   {em_all[m]['mean']:6.1f} {tokens[m]['mean']:10.0f}")
    calls = call_accuracy_3hop(summaries)
    for model, accuracy in calls.items():
        print(
            f"calls of the {model} model on gold inputs, 3-hop: "
            + ", ".join(f"{k} {v:.3f}" for k, v in accuracy.items())
        )
    judge = judge_3hop(per_seed)
    if judge:
        print(
            f"best-of-4 on {judge['questions']} 3-hop questions, chains right: greedy {judge['greedy']}, "
            f"some chain {judge['any']}, the penalty's pick {judge['penalty']}, a link check "
            f"{judge['link_check']}; the penalty ranks the right chain first in "
            f"{judge['right_first'] or 0:.0%} of {judge['pairs']} (right, wrong) pairs"
        )
    names = list(methods)
    x = [tokens[m]["mean"] for m in names]
    y = [em_all[m]["mean"] for m in names]
    frontier = [names[i] for i in pareto_frontier(x, y)]
    plot_scaling(names, x, y, Path(args.out) / "scaling.png", ylabel=f"EM, mean of {len(per_seed)} seeds")
    three = {m: em[m]["3"]["mean"] for m in METHODS if m in em and "3" in em[m]}
    print(json.dumps({
        "em_3hop": three,
        "em_3hop_spread": {m: em[m]["3"] for m in three},
        "em_by_hops": {m: {h: v["mean"] for h, v in em[m].items()} for m in methods},
        "tokens_per_question": {m: tokens[m]["mean"] for m in METHODS if m in tokens},
        "corag_greedy_minus_single_step_3hop": round(three.get("corag_greedy", 0) - three.get("single_step", 0), 2),
        "search_at_least_greedy_3hop": max(three.get("corag_best_of_4", -1), three.get("corag_tree", -1))
        >= three.get("corag_greedy", 0),
        "pareto_frontier": frontier,
        "call_accuracy_3hop": calls,
        "best_of_4_judge_3hop": judge,
        # How far the warm start got (docs/toy-study.md): teacher-forced, fresh worlds.
        "warm_heldout_accuracy": json.loads((warm / "warm_start.json").read_text())["heldout_accuracy"],
        "seeds": args.seeds,
        "dtype": compute_dtype(base.dtype),
        "wall_s": round(wall_s, 1),
        "warm_start_s": round(warm_s, 1),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
