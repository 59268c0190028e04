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

`launcher: local` (the default) runs every stage here, in this process or a child. `launcher: slurm` runs
each stage as the cluster path does (docs/cluster.md), one job after another from this driver process (on
the login node under tmux, or a small job of its own), from the project folder; every stage's request is
checked against the partition's nodes before round 1, and each job's id is recorded in the run folder, so
that a rerun waits for a job still running instead of submitting it again (corag.cluster.rounds):
1. sample: the sampling array (sampling/slurm_array.sh with `sampling_config`, each node serving the index
   `retriever` names, or searching the service URL it names), its shards then merged here into the
   round's chains; the sampling settings are `sampling_config`'s, its seed + r - 1 in round r.
2. pool: one job (sampling/slurm_pool.sh: `python -m corag.cluster.pool`) loads round r's sampler with
   `sampling_config`'s engine settings on one GPU and re-scores the earlier rounds' chains, then writes
   the pool as the local pool stage does. One engine scores every chain; the job is not sharded.
3. train: the SFT recipe over `train_sbatch`'s nodes (recipes/slurm_train.sh with `accelerate` and
   `sft_config`); its first process builds the pool's examples into `<model>-examples`.
4. evaluate: evaluation/slurm_eval.sh with `eval_config` over every GPU of its nodes, `eval_data` split
   into parts and merged, into the round's `eval/`.
Each job takes `sbatch_args` and its stage's flags (`sample_sbatch` with the array, `pool_sbatch`,
`train_sbatch`, `eval_sbatch`: nodes, partition, CPUs, memory, time); a failed job ends the run in one
line, and running the same command again resubmits the stage, whose job resumes from what it saved.
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from corag.cluster.rounds import check_requests, eval_job, pool_job, run_job, sample_job, train_job
from corag.cluster.stop import StopRequest
from corag.config import load_yaml
from corag.data.jsonl import (
    JsonlAppender,
    atomic_write,
    check_output,
    file_sha256,
    iter_jsonl,
    read_jsonl,
    write_jsonl,
)
from corag.errors import InputError
from corag.resources import CONFIGS, SFT_RECIPE
from corag.sampling import SamplingConfig, iter_chain_scores, merge_shards, shard_path
from corag.types import Example

INITS = ("base", "last")
LAUNCHERS = ("local", "slurm")
# Flags that say where and how big a job is, not what a round computes: they may change between runs.
SBATCH_FIELDS = ("sbatch_args", "sample_sbatch", "pool_sbatch", "train_sbatch", "eval_sbatch")


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
    launcher: str = field(
        default="local",
        metadata={
            "choices": list(LAUNCHERS),
            "help": "local: every stage here; slurm: each stage a job of the cluster path (sbatch --wait)",
        },
    )
    sampling_config: str | None = field(
        default=None,
        metadata={
            "help": "slurm: the sampling array's config (sampler, engine, num_shards); its model, "
            "questions, corpus, retriever and out_dir are the round's"
        },
    )
    eval_config: str | None = field(
        default=None,
        metadata={
            "help": "slurm: evaluation/slurm_eval.sh's config; its model, data and methods are the round's"
        },
    )
    accelerate: str = field(
        default="zero3",
        metadata={"help": "slurm: recipes/slurm_train.sh's accelerate config (zero3, fsdp, ddp)"},
    )
    sbatch_args: str = field(
        default="",
        metadata={"help": 'slurm: flags every job gets, one string: "--partition=gpu --account=me"'},
    )
    sample_sbatch: str = field(
        default="--array=0-0",
        metadata={"help": 'slurm: the sampling array\'s flags: "--array=0-1 --cpus-per-task=32 --mem=256G"'},
    )
    pool_sbatch: str = field(default="", metadata={"help": "slurm: the pool job's flags (one GPU)"})
    train_sbatch: str = field(default="--nodes=1", metadata={"help": "slurm: the SFT job's flags"})
    eval_sbatch: str = field(default="--nodes=1", metadata={"help": "slurm: the evaluation job's flags"})

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
        if self.launcher not in LAUNCHERS:
            raise InputError(f"choose one of {LAUNCHERS}, got {self.launcher!r}", field="launcher")
        if self.launcher == "slurm":
            self.check_slurm()
        from corag.evaluation import parse_runs

        parse_runs(self.methods)

    def check_slurm(self) -> None:
        """The stage configs exist and the sampling flags hold an array."""
        for name in ("sampling_config", "eval_config"):
            path = getattr(self, name)
            if not path or not Path(path).is_file():
                raise InputError(
                    f"launcher slurm needs this stage config, not found from {Path.cwd()}",
                    file=path,
                    field=name,
                )
        flags = shlex.split(self.sample_sbatch)
        if not any(f in ("--array", "-a") or f.startswith(("--array=", "-a")) for f in flags):
            raise InputError(
                f"give the array, e.g. --array=0-1, got {self.sample_sbatch!r}", field="sample_sbatch"
            )


def stage(name: str, done: Path | Sequence[Path], timings: dict[str, float], fn: Callable[[], Any]) -> None:
    """Run a stage unless its output (`done`, or every path of it) exists; record its wall time."""
    outputs = [done] if isinstance(done, Path) else list(done)
    if all(path.exists() for path in outputs):
        print(f"[{name}] already done ({outputs[0]})")
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
    load: Callable[[str], Any],
    scoring_prompt: str,
    path: Path,
    *,
    stop: StopRequest | None = None,
) -> bool:
    """Write `path`: for each question of the last round's chains, the best of its chains in the rounds'
    chain `files` (by round, oldest first), compared under the last round's `sampler` (`load` loads it,
    only when earlier chains are left to score): its own chains keep their scores, the earlier rounds'
    are scored again by it (under `scoring_prompt`, the prompt it sampled with; `rescore`). Each record
    gets that `score` and the `round` that sampled it. False, and no pool, when `stop` (Slurm's warning)
    came first: a rerun goes on with the chains scored so far."""
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
    inputs = {
        "sampler": sampler,
        "scoring_prompt": scoring_prompt,
        "chains": {str(k): file_sha256(files[k]) for k in rounds[:-1]},
    }
    scores = path.with_name(path.name.removesuffix(".jsonl") + ".scores.jsonl")
    rescored = rescore(earlier, by_id, corpus, partial(load, sampler), scoring_prompt, scores, inputs, stop)
    if rescored is None:
        return False
    again = iter(rescored)
    candidates: dict[str, list[tuple[float, int, dict[str, Any]]]] = {}
    for k in rounds:
        for record in chains[k]:
            score = record["score"] if k == last else next(again)
            candidates.setdefault(record["query_id"], []).append((score, k, record))
    # max keeps the first of equal scores: the oldest chain
    best = (max(candidates[r["query_id"]], key=lambda c: c[0]) for r in chains[last])
    kept = (
        {**record, "score": score, "scoring_prompt": scoring_prompt, "round": k} for score, k, record in best
    )
    write_jsonl(path, kept)
    scores.unlink(missing_ok=True)
    return True


def rescore(
    earlier: Sequence[dict[str, Any]],
    by_id: dict[str, Example],
    corpus: Any,
    load_sampler: Callable[[], Any],
    scoring_prompt: str,
    scores: Path,
    inputs: dict[str, Any],
    stop: StopRequest | None,
) -> list[float] | None:
    """The scores of the `earlier` chains under the sampler, each appended to `scores` as it comes (after a
    first line naming the `inputs`: the sampler, the prompt and each earlier file's hash), so that a pool
    that was stopped or killed goes on with what it scored; a `scores` file of other inputs is refused.
    None when `stop` came before every chain was scored."""
    if not earlier:
        return []
    # Flushed, not fsynced, line by line: a score lost in a machine crash is only scored again.
    with JsonlAppender(scores, fsync=False) as out:
        if not out.existing:
            out.append({"inputs": inputs})
        elif out.existing[0] != {"inputs": inputs}:
            raise InputError(
                "these scores were made with other inputs (sampler, scoring prompt or chain files); "
                "remove the file to score again",
                file=str(scores),
                field="inputs",
            )
        done = {line["chain"]: line["score"] for line in out.existing[1:]}
        todo = [i for i in range(len(earlier)) if i not in done]
        if todo and stop is not None and stop.received:
            return None
        if todo:
            chains = [earlier[i] for i in todo]
            scored = iter_chain_scores(chains, by_id, corpus, load_sampler(), scoring_prompt)
            with tqdm(total=len(earlier), initial=len(done), desc="scoring earlier rounds' chains") as bar:
                for j, score in scored:
                    out.append({"chain": todo[j], "score": score})
                    done[todo[j]] = score
                    bar.update()
                    if stop is not None and stop.received and len(done) < len(earlier):
                        return None
    return [done[i] for i in range(len(earlier))]


def iterate(cfg: IterateConfig, sampling: SamplingConfig) -> list[dict[str, Any]]:
    """Run (or resume) every round; returns the rows of the rounds table (also rounds.md/.json)."""
    from corag.data.corpus import Corpus
    from corag.data.formats import load_examples
    from corag.lm import load_lm
    from corag.retrieval import check_corpus, load_retriever

    cfg.check()
    sampling.check()
    slurm = cfg.launcher == "slurm"
    if slurm:
        sampling, num_shards = slurm_sampling(cfg, sampling)
        check_requests(cfg)  # every stage's job, before round 1 submits any
    out = Path(cfg.out_dir)
    jobs = out / "jobs.json"  # each stage's Slurm job id: a rerun waits for one still running
    check_output(out, "--out_dir", marks=("iterate.json", "jobs.json"))
    questions = load_examples(cfg.questions)[: cfg.limit]
    held_out = [] if slurm else load_examples(cfg.eval_data)[: cfg.eval_limit]
    corpus = Corpus.load(cfg.corpus)
    check_corpus(cfg.retriever, corpus)  # before any model loads or job starts
    out.mkdir(parents=True, exist_ok=True)
    settings = {**asdict(cfg), "sampling": asdict(sampling)}
    # These may change between runs; a local run also records none of the launcher's settings, so
    # that its folder resumes as it did before they existed.
    slurm_only = ("launcher", "sampling_config", "eval_config", "accelerate")
    for key in ("out_dir", "methods", "recipe", "rounds", *SBATCH_FIELDS, *([] if slurm else slurm_only)):
        settings.pop(key)
    check_same_settings(settings, out / "iterate.json", "rounds")
    retriever = None if slurm else load_retriever(cfg.retriever)
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
        config = replace(sampling, seed=sampling.seed + r - 1)
        if slurm:
            job = sample_job(cfg, sampler, config.seed, folder / "shards")
            sample = partial(
                sample_and_merge,
                job,
                jobs,
                f"round{r}/sample",
                folder / "shards",
                num_shards,
                questions,
                chains,
            )
            make_pool = partial(run_job, pool_job(cfg, files, sampler, pool), jobs, f"round{r}/pool")
            train = partial(run_job, train_job(cfg, start, pool, model, extra), jobs, f"round{r}/train")
        else:
            sample = partial(sample_here, questions, corpus, sampler, retriever, config, chains)
            make_pool = partial(
                pool_chains, files, questions, corpus, sampler, load_lm, config.scoring_prompt, pool
            )
            chains_data = {**data, "chains": str(pool)}
            train = partial(run_recipe, cfg.recipe, cfg.sft_config, start, model, chains_data, extra)
        folder.mkdir(exist_ok=True)
        stage(f"round {r}: sample", chains, timings, sample)
        stage(f"round {r}: pool", pool, timings, make_pool)
        stage(f"round {r}: train", model / "config.json", timings, train)
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
        if slurm:
            metrics = slurm_metrics(cfg, folder / "eval")
            evaluate = partial(run_job, eval_job(cfg, model, folder / "eval"), jobs, f"round{r}/evaluate")
            stage(f"round {r}: evaluate", list(metrics.values()), timings, evaluate)
            for name, path in metrics.items():
                row.update(metrics_row(name, json.loads(path.read_text())))
        else:
            row.update(evaluate_round(cfg, folder, model, held_out, corpus, retriever))
        rows.append(row)
    write_rounds(rows, out)
    return rows


def sample_here(
    questions: Sequence[Example],
    corpus: Any,
    sampler: str,
    retriever: Any,
    config: SamplingConfig,
    chains: Path,
) -> None:
    """The round's chains, sampled in this process (into a partial file, renamed once whole)."""
    from corag.lm import load_lm
    from corag.sampling import run_sampling

    partial_chains = chains.with_name("chains.partial.jsonl")
    run_sampling(questions, corpus, load_lm(sampler), retriever, config, partial_chains)
    partial_chains.rename(chains)


def sample_and_merge(
    command: list[str],
    jobs: Path,
    key: str,
    shards: Path,
    num_shards: int,
    questions: Sequence[Example],
    chains: Path,
) -> None:
    """The round's sampling array, then its shards merged into the round's chains (every question once)."""
    run_job(command, jobs, key)
    merge_shards([shard_path(shards, s, num_shards) for s in range(num_shards)], questions, chains)


def slurm_sampling(cfg: IterateConfig, sampling: SamplingConfig) -> tuple[SamplingConfig, int]:
    """Under `launcher: slurm`: the sampling settings and `num_shards` of `sampling_config`, which the
    array samples with; the iterate config must leave its own sampling settings unset."""
    default = SamplingConfig()
    given = [f.name for f in fields(SamplingConfig) if getattr(sampling, f.name) != getattr(default, f.name)]
    if given:
        raise InputError(
            f"under launcher slurm the sampling settings are sampling_config's ({cfg.sampling_config}): "
            "set them there",
            field=given[0],
        )
    values = load_yaml(cfg.sampling_config)
    config = SamplingConfig(**{f.name: values[f.name] for f in fields(SamplingConfig) if f.name in values})
    config.check()
    num_shards = values.get("num_shards")
    if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
        raise InputError(
            "set num_shards (a positive integer): the round merges the array's shards by it",
            file=cfg.sampling_config,
            field="num_shards",
        )
    return config, num_shards


def slurm_metrics(cfg: IterateConfig, out_root: Path) -> dict[str, Path]:
    """Each method's metrics.json as evaluation/slurm_eval.sh writes it: OUT_ROOT/<file>/<run>/, the run's
    folder named as `corag evaluate` names it."""
    from corag.evaluation import parse_runs, run_folder

    name = Path(cfg.eval_data).name.removesuffix(".jsonl")
    return {run.name: run_folder(out_root / name, run) / "metrics.json" for run in parse_runs(cfg.methods)}


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
        row.update(metrics_row(run.name, json.loads(metrics.read_text())))
    return row


def metrics_row(name: str, summary: dict[str, Any]) -> dict[str, Any]:
    """A method's columns of the rounds table: EM, F1, tokens per question, EM by hop count."""
    row = {f"{name} {key}": round(summary[key], 2) for key in ("em", "f1", "tokens_per_question")}
    for hops, em in sorted(summary.get("em_by_hops", {}).items(), key=lambda item: int(item[0])):
        row[f"{name} em_{hops}hop"] = round(em, 2)
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
