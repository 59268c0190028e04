"""GRPO against SFT alone and its controls on the toy world: the pre-registered protocol of docs/benchmarks.md.

For each seed (a target world of the quickstart's sizes with 200 held-out questions per hop count; also
the sampling and fine-tuning seed), from the shipped warm model, six runs:
- `sft`: SFT alone (the quickstart's study up to its fine-tuning: 300 training questions, 4 chains each);
- `round2`: one more round of rejection sampling (the SFT model samples the same questions, SFT again
  from it on its own chains); its training CPU time is the unit of compute;
- `sft4`: continued SFT from the SFT model on the first round's examples for 4x the round's compute
  (the control at GRPO's compute; constant learning rate, SFT's peak);
- `grpo4_placebo`: GRPO of 4x the round's compute with the advantages shuffled over each batch's chains;
- `grpo4`: GRPO of 4x the round's compute, outcome reward (configs/grpo/toy.yaml);
- `grpo4_step`: the same with credit per step (`credit: step`, reward f1 + 0.1 loglik_gain + 0.5 recall_gain).
Compute is counted as CPU seconds over torch's threads (`--time_limit_clock cpu`): the wall time on an
idle machine, so that other load on a shared machine shortens neither side.

Each model answers the split's questions (`test`: the world's 200 + 200 held-out 2- and 3-hop questions;
`dev`: 50 + 50 questions of another world, entities of its own, for every choice of settings) with greedy
L=3; SFT and the two GRPO runs also with greedy L=1 and L=2 and best-of-4 (L=3), whose four chains give
pass@4 (some chain's last sub-answer is a gold answer). A finished (seed, run) unit writes its per-question
scores to `--results` (results/<split>/seed<S>-<run>.json: committed, small); a rerun skips finished
units and retrains a model only where a later unit needs it and `--out` lost it. `--report` reads the
results alone: EM by hop count, and each run's paired difference with SFT alone (same seed, same
questions) with a 95% bootstrap interval over seeds and questions.

    nice -n 15 python benchmarks/rl.py [--seeds 0 1 2 3 4 5] [--runs ...] [--split test|dev]
    python benchmarks/rl.py --report

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROTOCOL = 2  # a result file of another protocol is not read
RUNS = ("sft", "round2", "grpo4", "grpo4_placebo", "grpo4_step", "sft4")  # a seed's units, in order
TIMES = 4  # GRPO's and the control's compute, in rounds
STEP_REWARD = ["f1", "0.1*loglik_gain", "0.5*recall_gain"]  # fixed before any run (docs/benchmarks.md)
GREEDY = {"L1": "greedy:L=1", "L2": "greedy:L=2", "L3": "greedy:L=3"}
BEST = "best_of_n:L=3:N=4"
FULL = ("sft", "grpo4", "grpo4_step")  # also L=1, L=2, best-of-4 and pass@4
SPLITS = {"test": (200, 0), "dev": (50, 1000)}  # questions per hop count, world seed offset
BOOTSTRAP = 2000


def unit_file(results: Path, split: str, seed: int, run: str) -> Path:
    return results / split / f"seed{seed}-{run}.json"


def read_unit(path: Path) -> dict | None:
    if not path.exists():
        return None
    unit = json.loads(path.read_text())
    return unit if unit.get("protocol") == PROTOCOL else None


class Seed:
    """One seed's world, models and compute: the study (SFT alone) is run or resumed on first use."""

    def __init__(self, seed: int, out: Path) -> None:
        from corag.config import load_yaml
        from corag.toy.quickstart import CONFIG, WARM
        from corag.toy.study import StudyConfig

        settings = {k: v for k, v in load_yaml(CONFIG).items() if k in StudyConfig.__dataclass_fields__}
        self.seed, self.out = seed, out
        self.cfg = replace(
            StudyConfig(**settings), seed=seed, out_dir=str(out), warm_dir=str(WARM), test_per_hop=200,
            test_questions=400, evals=[f"sft=corag@{GREEDY['L3']}"], recipe=str(REPO / "recipes/sft.py"),
            sft_config=str(REPO / StudyConfig(**settings).sft_config),
        )  # fmt: skip
        self.ready = False

    def prepare(self) -> None:
        """The study up to SFT alone (resumed where it stopped), the world, corpus and retriever."""
        if self.ready:
            return
        from corag.data.corpus import Corpus
        from corag.retrieval import load_retriever
        from corag.toy.study import run_study
        from corag.toy.world import generate_world

        run_study(self.cfg)
        c = self.cfg
        self.world = generate_world(
            seed=c.seed, num_entities=c.num_entities, num_distractors=c.num_distractors,
            train_per_hop=c.train_per_hop, test_per_hop=c.test_per_hop,
        )  # fmt: skip
        self.corpus_file, self.index = self.out / "world" / "corpus.jsonl", self.out / "index"
        self.corpus, self.retriever = Corpus.load(self.corpus_file), load_retriever(self.index)
        self.ready = True

    def model(self, run: str) -> Path:
        return self.out / "models" / ("corag" if run == "sft" else run)


def train(seed: Seed, run: str, round_compute: float | None) -> dict:
    """Train `run`'s model unless it is there; what the training cost and logged."""
    from corag.iterate import run_recipe
    from corag.lm import load_lm
    from corag.sampling import SamplingConfig, run_sampling
    from corag.toy.study import compute_dtype
    from corag.training.recipes import compute_seconds

    seed.prepare()  # SFT alone: the study, whose own compute is not counted here
    out, cfg, folder = seed.out, seed.cfg, seed.model(run)
    if run == "sft" or (folder / "config.json").exists():
        return {}
    start = compute_seconds()
    sft = seed.model("sft")
    if run == "round2":  # the SFT model samples the same questions; SFT again from it on its own chains
        chains, partial = out / "chains-round2.jsonl", out / "chains-round2.partial.jsonl"
        if not chains.exists():
            config = SamplingConfig(num_chains=cfg.num_chains, max_length=cfg.max_length, seed=cfg.seed)
            lm = load_lm(sft, dtype=compute_dtype(cfg.dtype))
            run_sampling(
                seed.world.train[: cfg.sample_questions], seed.corpus, lm, seed.retriever, config, partial
            )
            partial.rename(chains)
        data = {"corpus": str(seed.corpus_file), "index": str(seed.index), "chains": str(chains)}
        run_recipe(cfg.recipe, cfg.sft_config, sft, folder, data, [f"--seed={cfg.seed}", "--bf16", "false"])
        trained = {"train_cpu_s": round(compute_seconds() - start, 1)}
        (out / "round2-compute.json").write_text(json.dumps(trained))  # the unit of compute, kept
        return trained
    minutes = str(TIMES * round_compute / 60)
    limit = ["--max_steps", "100000", "--time_limit_minutes", minutes, "--time_limit_clock", "cpu"]
    if run == "sft4":  # continued SFT on the first round's examples, at GRPO's compute
        data = {"dataset": str(out / "models" / "corag-examples")}
        extra = [
            f"--seed={cfg.seed}",
            "--bf16",
            "false",
            "--lr_scheduler_type",
            "constant",
            "--warmup_steps",
            "0",
        ]
        run_recipe(cfg.recipe, cfg.sft_config, sft, folder, data, [*extra, *limit])
    else:
        args = [
            sys.executable, str(REPO / "recipes/grpo.py"), "--config", str(REPO / "configs/grpo/toy.yaml"),
            "--model_name_or_path", str(sft), "--output_dir", str(folder),
            "--questions", str(out / "world" / "train.jsonl"), "--limit", str(cfg.sample_questions),
            "--corpus", str(seed.corpus_file), "--retriever", str(seed.index), "--save_strategy", "no",
            "--logging_steps", "1", "--seed", str(seed.seed), *limit,
        ]  # fmt: skip
        if run == "grpo4_placebo":
            args += ["--shuffle_advantages", "true"]
        if run == "grpo4_step":
            args += ["--credit", "step", "--reward", *STEP_REWARD]
        subprocess.run(args, check=True)
    return {"train_cpu_s": round(compute_seconds() - start, 1), **training_log(folder)}


def training_log(folder: Path) -> dict:
    """Steps, the training reward in the first and last tenth of steps, zero-spread groups, stop rate."""
    state = json.loads((folder / "trainer_state.json").read_text())
    steps = [r for r in state["log_history"] if "reward" in r]
    if not steps:  # SFT
        return {"steps": state["global_step"]}
    tenth = max(1, len(steps) // 10)
    mean = statistics.fmean
    return {
        "steps": len(steps),
        "reward_first_tenth": round(mean(r["reward"] for r in steps[:tenth]), 4),
        "reward_last_tenth": round(mean(r["reward"] for r in steps[-tenth:]), 4),
        "zero_spread": round(mean(r["zero_spread"] for r in steps), 3),
        "stop_rate": round(mean(r["stop_rate"] for r in steps), 3),
    }


def split_questions(seed: Seed, split: str) -> tuple[list, object, object, Path]:
    """The split's questions with the corpus and retriever they are answered from, and the eval folder."""
    from corag.toy.study import balanced_by_hops

    per_hop, offset = SPLITS[split]
    if split == "test":
        tested = [e for e in seed.world.test if int(e.meta["hops"]) in (2, 3)]
        return balanced_by_hops(tested, 2 * per_hop), seed.corpus, seed.retriever, seed.out / "eval"
    from corag.data.corpus import Corpus
    from corag.retrieval import load_retriever
    from corag.retrieval.dense import Encoder
    from corag.retrieval.index import build_dense
    from corag.toy.world import generate_world

    c, folder = seed.cfg, seed.out / "dev"
    world = generate_world(
        seed=c.seed + offset, num_entities=c.num_entities, num_distractors=c.num_distractors,
        train_per_hop=1, test_per_hop=per_hop,
    )  # fmt: skip
    if not (folder / "index" / "manifest.json").exists():
        world.write(folder / "world")
        build_dense(
            Corpus.load(folder / "world" / "corpus.jsonl"), folder / "index", Encoder.from_preset("minilm")
        )
    tested = [e for e in world.test if int(e.meta["hops"]) in (2, 3)]
    corpus = Corpus.load(folder / "world" / "corpus.jsonl")
    return balanced_by_hops(tested, 2 * per_hop), corpus, load_retriever(folder / "index"), folder / "eval"


def evaluate(seed: Seed, run: str, split: str) -> dict:
    """Per question: EM and tokens of each method, and pass@4 where best-of-4 runs."""
    from corag.evaluation import parse_runs, run_method
    from corag.lm import load_lm
    from corag.metrics import answer_scores, exact_match
    from corag.toy.study import compute_dtype

    questions, corpus, retriever, folder = split_questions(seed, split)
    methods = {**GREEDY, "best4": BEST} if run in FULL else {"L3": GREEDY["L3"]}
    lm = load_lm(seed.model(run), dtype=compute_dtype(seed.cfg.dtype))
    scores: dict = {"hops": {q.id: int(q.meta["hops"]) for q in questions}, "evals": {}}
    for name, spec in methods.items():
        label = "sft" if (run, name, split) == ("sft", "L3", "test") else f"{run}-{name}"  # the study's
        (method,) = parse_runs([spec])
        path = folder / label / "predictions.jsonl"
        records = run_method(method, questions, lm, retriever, corpus, path, max_active=seed.cfg.max_active)
        scores["evals"][name] = {
            q.id: [answer_scores(r["predictions"], q.answers)["em"], r["usage"]["total_tokens"]]
            for q, r in zip(questions, records, strict=True)
        }
        if name == "best4":
            scores["pass4"] = {
                q.id: float(
                    any(c and any(exact_match(c[-1]["subanswer"], a) for a in q.answers) for c in r["chains"])
                )
                for q, r in zip(questions, records, strict=True)
            }
    return scores


def run_units(seeds: list[int], runs: list[str], out: Path, results: Path, split: str) -> None:
    """Every (seed, run) unit not finished in `results`, in order; each writes its file when done."""
    from corag.training.recipes import compute_seconds

    for s in seeds:
        seed = Seed(s, out / f"seed{s}")
        for run in runs:
            path = unit_file(results, split, s, run)
            if read_unit(path) is not None:
                print(f"seed {s} {run}: done ({path})", flush=True)
                continue
            start, wall = compute_seconds(), time.perf_counter()
            compute = round_compute(seed, results) if run != "sft" else None
            trained = {"train_cpu_s": compute} if run == "round2" else train(seed, run, compute)
            middle = compute_seconds()
            scores = evaluate(seed, run, split)
            unit = {
                "protocol": PROTOCOL, "seed": s, "run": run, "split": split, "train": trained,
                "cpu_s": round(compute_seconds() - start, 1), "eval_cpu_s": round(compute_seconds() - middle, 1),
                "wall_s": round(time.perf_counter() - wall, 1), **scores,
            }  # fmt: skip
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(unit, separators=(",", ":")))
            tmp.replace(path)
            print(f"seed {s} {run}: {unit['cpu_s']} CPU s, wall {unit['wall_s']} s -> {path}", flush=True)


def round_compute(seed: Seed, results: Path) -> float:
    """The round's training CPU seconds (the unit of compute): from its finished unit, else from its
    record beside the model, the round trained first where neither is left."""
    unit = read_unit(unit_file(results, "test", seed.seed, "round2"))
    if unit is not None:
        return unit["train"]["train_cpu_s"]
    record = seed.out / "round2-compute.json"
    if not record.exists():
        shutil.rmtree(seed.model("round2"), ignore_errors=True)  # a model without its compute is redone
        train(seed, "round2", None)
    return json.loads(record.read_text())["train_cpu_s"]


def bootstrap(diffs: dict[int, list[float]], rng: random.Random) -> tuple[float, float, float]:
    """Mean paired difference over seeds and questions, and its 95% interval: seeds resampled, then
    questions within each resampled seed."""
    seeds = sorted(diffs)
    mean = statistics.fmean(d for s in seeds for d in diffs[s])
    draws = []
    for _ in range(BOOTSTRAP):
        picked = [rng.choice(seeds) for _ in seeds]
        values = [d for s in picked for d in rng.choices(diffs[s], k=len(diffs[s]))]
        draws.append(statistics.fmean(values))
    draws.sort()
    return mean, draws[int(0.025 * BOOTSTRAP)], draws[int(0.975 * BOOTSTRAP) - 1]


def report(results: Path, split: str) -> dict:
    """EM by hop count per run, and each run's paired difference with SFT alone (95% bootstrap)."""
    units = [read_unit(p) for p in sorted((results / split).glob("seed*-*.json"))]
    units = [u for u in units if u is not None]
    by = {(u["seed"], u["run"]): u for u in units}
    rng = random.Random(0)
    table: dict = {}
    for run in RUNS:
        seeds = sorted(s for s, r in by if r == run)
        if not seeds:
            continue
        row: dict = {"seeds": seeds, "cpu_s": round(statistics.fmean(by[s, run]["cpu_s"] for s in seeds), 1)}
        for hops in (2, 3):
            ems = [
                em
                for s in seeds
                for q, (em, _) in by[s, run]["evals"]["L3"].items()
                if by[s, run]["hops"][q] == hops
            ]
            row[f"em_{hops}hop"] = round(100 * statistics.fmean(ems), 1)
            paired = {
                s: [
                    100 * (em - by[s, "sft"]["evals"]["L3"][q][0])
                    for q, (em, _) in by[s, run]["evals"]["L3"].items()
                    if by[s, run]["hops"][q] == hops
                ]
                for s in seeds
                if (s, "sft") in by
            }
            if run != "sft" and paired:
                mean, low, high = bootstrap(paired, rng)
                row[f"diff_{hops}hop"] = [round(mean, 1), round(low, 1), round(high, 1)]
        if run in FULL:
            for name in ("L1", "L2", "L3", "best4"):
                cells = [
                    v
                    for s in seeds
                    if name in by[s, run]["evals"]
                    for v in by[s, run]["evals"][name].values()
                ]
                if cells:
                    row[f"{name}_em"] = round(100 * statistics.fmean(c[0] for c in cells), 1)
                    row[f"{name}_tokens"] = round(statistics.fmean(c[1] for c in cells))
            passes = [v for s in seeds for v in by[s, run].get("pass4", {}).values()]
            if passes:
                row["pass4"] = round(100 * statistics.fmean(passes), 1)
        table[run] = row
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    parser.add_argument("--split", choices=list(SPLITS), default="test")
    parser.add_argument("--out", default="runs/bench-rl", help="models and predictions (may be lost)")
    parser.add_argument(
        "--results", default=str(REPO / "benchmarks/results/rl"), help="finished units (kept)"
    )
    parser.add_argument("--report", action="store_true", help="only report the finished units")
    args = parser.parse_args()
    results = Path(args.results)
    if not args.report:
        run_units(args.seeds, args.runs, Path(args.out), results, args.split)
    table = report(results, args.split)
    for run, row in table.items():
        print(f"{run}: {json.dumps(row)}")
    print(json.dumps({"split": args.split, "runs": table}))


if __name__ == "__main__":
    main()
