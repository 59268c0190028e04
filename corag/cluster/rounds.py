"""The Slurm jobs of a `corag iterate` round under `launcher: slurm` (corag.iterate): each stage's sbatch
command, built from the iterate config, and the wait for its end."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class RoundSettings(Protocol):
    """What the jobs read of an iterate config (corag.iterate.IterateConfig)."""

    questions: str
    corpus: str
    retriever: str
    limit: int | None
    eval_data: str
    eval_limit: int | None
    methods: list[str]
    sft_config: str
    sampling_config: str
    eval_config: str
    accelerate: str
    sbatch_args: str
    sample_sbatch: str
    pool_sbatch: str
    train_sbatch: str
    eval_sbatch: str


# The cluster path's launch scripts, submitted from the project folder as docs/cluster.md does.
SCRIPTS = {
    "sample": "sampling/slurm_array.sh",
    "pool": "sampling/slurm_pool.sh",
    "train": "recipes/slurm_train.sh",
    "evaluate": "evaluation/slurm_eval.sh",
}


class JobFailed(RuntimeError):
    """A stage's Slurm job ended without success; rerunning the same command resumes it."""


def sbatch(cfg: RoundSettings, stage: str, flags: str, args: Sequence[str]) -> list[str]:
    """The sbatch command of a stage's job (`sbatch_args`, then the stage's `flags`); it returns when the
    job has ended (--wait), with the job's exit status."""
    return ["sbatch", "--wait", *shlex.split(cfg.sbatch_args), *shlex.split(flags), SCRIPTS[stage], *args]


def retrieval_flags(cfg: RoundSettings) -> tuple[list[str], list[str]]:
    """(the launcher's flags, the command's flags): an index folder is served on every node of the job
    (--serve-index); a service URL is searched as it is (--retriever)."""
    if "://" in cfg.retriever:
        return [], ["--retriever", cfg.retriever]
    return ["--serve-index", cfg.retriever], []


def sample_job(cfg: RoundSettings, sampler: str, seed: int, shards: Path) -> list[str]:
    """The round's sampling array: `sampling_config` with the round's sampler, seed and shard folder."""
    serve, search = retrieval_flags(cfg)
    limit = ["--limit", str(cfg.limit)] if cfg.limit is not None else []
    sample = [
        "--model",
        sampler,
        "--questions",
        cfg.questions,
        "--corpus",
        cfg.corpus,
        "--out_dir",
        str(shards),
    ]
    return sbatch(
        cfg,
        "sample",
        cfg.sample_sbatch,
        [cfg.sampling_config, *serve, "--", *sample, "--seed", str(seed), *limit, *search],
    )


def pool_job(cfg: RoundSettings, files: dict[int, Path], sampler: str, pool: Path) -> list[str]:
    """The round's pool job (python -m corag.cluster.pool): the rounds' chain files as ROUND=FILE."""
    limit = ["--limit", str(cfg.limit)] if cfg.limit is not None else []
    args = [cfg.sampling_config, "--model", sampler, "--questions", cfg.questions, "--corpus", cfg.corpus]
    return sbatch(
        cfg,
        "pool",
        cfg.pool_sbatch,
        [*args, *limit, "--out", str(pool), *(f"{k}={f}" for k, f in files.items())],
    )


def train_job(cfg: RoundSettings, start: str, pool: Path, model: Path, extra: Sequence[str]) -> list[str]:
    """The round's SFT job: the recipe builds the pool's examples (into <model>-examples, not the
    config's dataset) and trains `start` on them over the job's nodes."""
    index = [] if "://" in cfg.retriever else ["--index", cfg.retriever]
    args = ["sft", cfg.accelerate, cfg.sft_config, "--model_name_or_path", start, "--output_dir", str(model)]
    args += ["--chains", str(pool), "--corpus", cfg.corpus, *index, "--dataset", "none", *extra]
    return sbatch(cfg, "train", cfg.train_sbatch, args)


def eval_job(cfg: RoundSettings, model: Path, out_root: Path) -> list[str]:
    """The round's evaluation job: `eval_config` with the round's model and `methods` on `eval_data`."""
    serve, search = retrieval_flags(cfg)
    limit = ["--limit", str(cfg.eval_limit)] if cfg.eval_limit is not None else []
    args = [cfg.eval_config, *serve, "--data", cfg.eval_data, "--out-root", str(out_root), "--"]
    args += ["--model", str(model), "--corpus", cfg.corpus, *limit, *search, "--methods", *cfg.methods]
    return sbatch(cfg, "evaluate", cfg.eval_sbatch, args)


def run_job(command: list[str]) -> None:
    """Submit a stage's job and wait for its end; JobFailed unless it completed."""
    print(shlex.join(command), flush=True)
    status = subprocess.run(command).returncode
    if status != 0:
        script = next(word for word in command if word in SCRIPTS.values())
        raise JobFailed(
            f"the job of {script} ended with status {status} (see its Slurm .out file and logs/); "
            "run the same command again to resume it"
        )
