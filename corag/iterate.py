"""Iterated rejection sampling (expert iteration): each round's fine-tuned model samples the next round.

Round r = 1..R:
1. **sample**: chains for the training questions with the sampling stage (corag.sampling: the best of
   `num_chains` per question kept), sampled by `model` in round 1 and by round r-1's checkpoint after;
   round r samples with seed `seed + r - 1`.
2. **pool**: the round's training set, `pool.jsonl`: for each question, the best chain over rounds 1..r
   (`pool: true`; else the round's own chains only), and round 0, the chains `model` was fine-tuned on,
   where `round0_chains` names them. A chain's score is the gold answer's log-likelihood
   under the model that sampled it, and the samplers differ from round to round, so the candidates are
   compared under one model, round r's sampler: its own chains keep the score it gave them, the earlier
   rounds' chains are scored again by it (equal scores keep the older chain). Training on the model's own
   new chains alone made a second round forget: held-out EM fell on the toy world (docs/benchmarks.md).
3. **train**: the SFT recipe (`recipe` with `sft_config`, one process) on the pool, from the base `model`
   (`init: base`, as ReST-EM does) or from round r-1's checkpoint (`init: last`; round 1 starts from
   `model`), the later rounds then at `last_learning_rate` where it is set.
4. **evaluate**: each of `methods` answers the held-out questions (`eval_data`).

Every stage of every round runs once: a rerun of the same folder resumes at the first unfinished stage
(sampling also resumes inside a stage, block by block), and a folder made with other settings is refused.
`rounds.md` and `rounds.json` table the rounds.
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from corag.data.jsonl import atomic_write, check_output, iter_jsonl, read_jsonl, write_jsonl
from corag.errors import InputError
from corag.resources import CONFIGS, SFT_RECIPE
from corag.sampling import SamplingConfig
from corag.types import Example

INITS = ("base", "last")


@dataclass
class IterateConfig:
    """What the rounds run on, where they write, and how each round trains and is evaluated."""

    model: str | None = field(default=None, metadata={"help": "the first round's sampler and the base model"})
    questions: str | None = field(default=None, metadata={"help": "training questions (gold answers needed)"})
    corpus: str | None = field(default=None, metadata={"help": "corpus file or dataset folder"})
    retriever: str | None = field(default=None, metadata={"help": "index folder, or a retrieval service URL"})
    eval_data: str | None = field(default=None, metadata={"help": "held-out questions each round answers"})
    out_dir: str = field(default="runs/iterate", metadata={"help": "one folder a run; a rerun resumes it"})
    rounds: int = field(default=2, metadata={"help": "rounds of sampling and training (R)"})
    init: str = field(
        default="last",
        metadata={
            "choices": list(INITS),
            "help": "each round trains from the base model or the last checkpoint",
        },
    )
    last_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "init: last only: rounds 2..R train at this learning rate (unset: the SFT config's), "
            "since they fine-tune a fine-tuned model again, partly on chains it was trained on"
        },
    )
    pool: bool = field(
        default=True,
        metadata={
            "help": "train each round on the best chain per question over all rounds so far "
            "(false: on the round's own chains only)"
        },
    )
    round0_chains: str | None = field(
        default=None,
        metadata={
            "help": "with pool: chains sampled before round 1 (those `model` was fine-tuned on), every "
            "round's candidates too, as round 0"
        },
    )
    limit: int | None = field(default=None, metadata={"help": "only the first N training questions"})
    eval_limit: int | None = field(default=None, metadata={"help": "only the first N held-out questions"})
    methods: list[str] = field(default_factory=lambda: ["greedy:L=3"], metadata={"help": "evaluations"})
    recipe: str = field(
        default=str(SFT_RECIPE), metadata={"help": "the SFT recipe, a path (default: the package's)"}
    )
    sft_config: str = field(
        default=str(CONFIGS / "sft/toy.yaml"),
        metadata={"help": "the recipe's config, a path (default: the package's toy config)"},
    )
    sft_args: str = field(default="", metadata={"help": 'more recipe flags, one string: "--max_steps 10"'})

    def check(self) -> None:
        for name in ("model", "questions", "corpus", "retriever", "eval_data"):
            if not getattr(self, name):
                raise InputError("required", field=name)
        if self.rounds < 1:
            raise InputError(f"must be 1 or more, got {self.rounds}", field="rounds")
        if self.init not in INITS:
            raise InputError(f"choose one of {INITS}, got {self.init!r}", field="init")
        if self.last_learning_rate is not None and not self.last_learning_rate > 0:
            raise InputError(f"must be above 0, got {self.last_learning_rate}", field="last_learning_rate")
        if self.round0_chains and not Path(self.round0_chains).is_file():
            raise InputError("not found", file=self.round0_chains, field="round0_chains")
        for name in ("recipe", "sft_config"):
            if not Path(getattr(self, name)).is_file():
                raise InputError(f"not found from {Path.cwd()}", file=getattr(self, name), field=name)
        from corag.evaluation import parse_runs

        parse_runs(self.methods)


def stage(name: str, done: Path, timings: dict[str, float], fn: Callable[[], Any]) -> None:
    """Run a stage unless its output (`done`) exists; record its wall time."""
    if done.exists():
        print(f"[{name}] already done ({done})")
        return
    print(f"[{name}] ...", flush=True)
    start = time.perf_counter()
    fn()
    timings[name] = round(time.perf_counter() - start, 1)
    print(f"[{name}] done in {timings[name]:.0f}s", flush=True)


def run_recipe(
    recipe: str, config: str, model: Path | str, out: Path, data: dict[str, str], extra: Sequence[str] = ()
) -> None:
    """Run the SFT recipe in a subprocess, exactly as a user would (one process)."""
    args = [sys.executable, recipe, "--config", config, "--model_name_or_path", str(model)]
    args += ["--output_dir", str(out), *[x for k, v in data.items() for x in (f"--{k}", v)], *extra]
    subprocess.run(args, check=True)


def check_same_settings(settings: dict[str, Any], path: Path, what: str) -> None:
    """Record the settings a folder's finished stages depend on, or refuse to resume one made with others."""
    if not path.exists():
        with atomic_write(path) as f:
            json.dump(settings, f, indent=2)
        return
    before = json.loads(path.read_text())
    changed = sorted(k for k in settings.keys() | before.keys() if settings.get(k) != before.get(k))
    if changed:
        shown = ", ".join(f"{k}: {before.get(k)!r} -> {settings.get(k)!r}" for k in changed)
        raise InputError(
            f"this folder holds {what} made with other settings ({shown}); choose another --out_dir or remove it",
            file=str(path),
            field=changed[0],
        )


def pool_chains(
    files: dict[int, Path],
    questions: Sequence[Example],
    corpus: Any,
    sampler: str,
    scoring_prompt: str,
    path: Path,
) -> None:
    """Write `path`: for each question of the last round's chains, the best of its chains in the rounds'
    chain `files` (by round, oldest first), compared under the last round's `sampler`: its own chains
    keep their scores, the earlier rounds' are scored again by it (under `scoring_prompt`, the prompt it
    sampled with). Each record gets that `score` and the `round` that sampled it."""
    from corag.lm import load_lm
    from corag.sampling import score_chains

    by_id = {e.id: e for e in questions}
    chains = {k: read_jsonl(file) for k, file in files.items()}
    for k, records in chains.items():
        for record in records:
            if record.get("query_id") not in by_id or not isinstance(record.get("steps"), list):
                raise InputError(
                    "not a sampled chain of a question in --questions",
                    file=str(files[k]),
                    record=record.get("query_id"),
                    field="query_id" if record.get("query_id") not in by_id else "steps",
                )
    rounds = list(files)
    last = rounds[-1]
    earlier = [record for k in rounds[:-1] for record in chains[k]]
    rescored = iter(score_chains(earlier, by_id, corpus, load_lm(sampler), scoring_prompt) if earlier else [])
    candidates: dict[str, list[tuple[float, int, dict[str, Any]]]] = {}
    for k in rounds:
        for record in chains[k]:
            score = record["score"] if k == last else next(rescored)
            candidates.setdefault(record["query_id"], []).append((score, k, record))
    # max keeps the first of equal scores: the oldest chain
    best = (max(candidates[r["query_id"]], key=lambda c: c[0]) for r in chains[last])
    kept = (
        {**record, "score": score, "scoring_prompt": scoring_prompt, "round": k} for score, k, record in best
    )
    write_jsonl(path, kept)


def iterate(cfg: IterateConfig, sampling: SamplingConfig) -> list[dict[str, Any]]:
    """Run (or resume) every round; returns the rows of the rounds table (also rounds.md/.json)."""
    from corag.data.corpus import Corpus
    from corag.data.formats import load_examples
    from corag.lm import load_lm
    from corag.retrieval import check_corpus, load_retriever
    from corag.sampling import run_sampling

    cfg.check()
    sampling.check()
    out = Path(cfg.out_dir)
    check_output(out, "--out_dir", marks=("iterate.json",))
    questions = load_examples(cfg.questions)[: cfg.limit]
    held_out = load_examples(cfg.eval_data)[: cfg.eval_limit]
    corpus = Corpus.load(cfg.corpus)
    check_corpus(cfg.retriever, corpus)  # before any model loads
    out.mkdir(parents=True, exist_ok=True)
    settings = {**asdict(cfg), "sampling": asdict(sampling)}
    for key in ("out_dir", "methods", "recipe", "rounds"):  # these may change between runs
        settings.pop(key)
    check_same_settings(settings, out / "iterate.json", "rounds")
    retriever = load_retriever(cfg.retriever)
    data = {"corpus": cfg.corpus, **({"index": cfg.retriever} if "://" not in cfg.retriever else {})}
    rows, timings = [], {}
    for r in range(1, cfg.rounds + 1):
        folder = out / f"round{r}"
        sampler = cfg.model if r == 1 else str(out / f"round{r - 1}" / "model")
        start = cfg.model if cfg.init == "base" or r == 1 else sampler
        chains, pool, model = folder / "chains.jsonl", folder / "pool.jsonl", folder / "model"
        files = {k: out / f"round{k}" / "chains.jsonl" for k in (range(1, r + 1) if cfg.pool else [r])}
        if cfg.pool and cfg.round0_chains:
            files = {0: Path(cfg.round0_chains), **files}
        lr = cfg.last_learning_rate if cfg.init == "last" and r > 1 else None
        extra = [*shlex.split(cfg.sft_args), *([f"--learning_rate={lr}"] if lr else [])]

        def sample(sampler: str = sampler, chains: Path = chains, r: int = r) -> None:
            partial = chains.with_name("chains.partial.jsonl")
            config = replace(sampling, seed=sampling.seed + r - 1)
            run_sampling(questions, corpus, load_lm(sampler), retriever, config, partial)
            partial.rename(chains)

        folder.mkdir(exist_ok=True)
        stage(f"round {r}: sample", chains, timings, sample)
        stage(
            f"round {r}: pool",
            pool,
            timings,
            lambda files=files, sampler=sampler, pool=pool: pool_chains(
                files, questions, corpus, sampler, sampling.scoring_prompt, pool
            ),
        )
        stage(
            f"round {r}: train",
            model / "config.json",
            timings,
            lambda start=start, pool=pool, model=model, extra=extra: run_recipe(
                cfg.recipe, cfg.sft_config, start, model, {**data, "chains": str(pool)}, extra
            ),
        )
        scores = [float(rec["score"]) for _, rec in iter_jsonl(chains)]
        kept = [rec["round"] for _, rec in iter_jsonl(pool)]
        row: dict[str, Any] = {
            "round": r,
            "sampled_by": sampler,
            "trained_from": start,
            "learning_rate": lr or "sft_config",
            "chains": len(kept),
            "from_earlier_rounds": sum(k < r for k in kept),
            "mean_chain_score": round(statistics.fmean(scores), 4) if scores else None,
        }
        row.update(evaluate_round(cfg, folder, model, held_out, corpus, retriever))
        rows.append(row)
    write_rounds(rows, out)
    return rows


def evaluate_round(
    cfg: IterateConfig, folder: Path, model: Path, held_out: list, corpus: Any, retriever: Any
) -> dict[str, Any]:
    """Each method on the held-out questions (resumed per question): EM, F1, tokens per question and EM
    by hop count where the questions have one."""
    from corag.evaluation import parse_runs, run_method, score_records
    from corag.lm import load_lm

    lm, row = None, {}
    for run in parse_runs(cfg.methods):
        path = folder / "eval" / run.name.replace(":", "_") / "predictions.jsonl"
        metrics = path.with_name("metrics.json")
        if not metrics.exists():
            lm = lm or load_lm(model)
            records = run_method(run, held_out, lm, retriever, corpus, path)
            summary = score_records(held_out, records)
            with atomic_write(metrics) as f:
                json.dump(summary, f, indent=2)
        summary = json.loads(metrics.read_text())
        for key in ("em", "f1", "tokens_per_question"):
            row[f"{run.name} {key}"] = round(summary[key], 2)
        for hops, em in sorted(summary.get("em_by_hops", {}).items(), key=lambda item: int(item[0])):
            row[f"{run.name} em_{hops}hop"] = round(em, 2)
    return row


def write_rounds(rows: list[dict[str, Any]], out: Path) -> None:
    """rounds.json and rounds.md: one row a round."""
    with atomic_write(out / "rounds.json") as f:
        json.dump(rows, f, indent=2)
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    with atomic_write(out / "rounds.md") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
