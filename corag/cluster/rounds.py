"""The Slurm jobs of a `corag iterate` round under `launcher: slurm` (corag.iterate): each stage's sbatch
command, built from the iterate config, checked against the partition's nodes before round 1, submitted,
its job id recorded in the run folder (`jobs.json`), and waited for by asking Slurm (squeue, then
`scontrol show job`), so that the driver holds no `sbatch --wait` and can be killed at any time.

A rerun of the same folder finds the stage's recorded job: still pending or running, it waits for that
job instead of submitting another; ended COMPLETED, it goes on; ended otherwise (failed, cancelled, out of
time), or unknown to Slurm (ended long ago), it says so in one line and submits the stage anew. The
driver ended by SIGTERM or SIGHUP (a closed session, a login node's reboot) leaves its job running, says
so in one line naming it, and exits; a rerun waits for it (`scancel JOB` stops it instead)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from corag.cluster.submit import check, header_options, node_groups, parse_request
from corag.data.jsonl import atomic_write
from corag.errors import InputError
from corag.resources import stage_script


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


# The launch script of each stage of a round, from the installed package (corag.resources).
SCRIPTS = {stage: str(stage_script(stage)) for stage in ("sample", "pool", "train", "evaluate")}


class JobFailed(RuntimeError):
    """A stage's Slurm job ended without success; rerunning the same command resumes it."""


# Slurm's job states of a job that may still run (squeue lists no other).
ACTIVE = (
    "PENDING",
    "RUNNING",
    "CONFIGURING",
    "COMPLETING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "RESIZING",
    "SUSPENDED",
)


def sbatch(cfg: RoundSettings, stage: str, flags: str, args: Sequence[str]) -> list[str]:
    """The sbatch command of a stage's job (`sbatch_args`, then the stage's `flags`); it prints the job id
    alone (--parsable) and returns at once."""
    return ["sbatch", "--parsable", *shlex.split(cfg.sbatch_args), *shlex.split(flags), SCRIPTS[stage], *args]


def stage_flags(cfg: RoundSettings) -> dict[str, str]:
    """Each stage's sbatch flags: `sbatch_args`, then the stage's own."""
    own = {
        "sample": cfg.sample_sbatch,
        "pool": cfg.pool_sbatch,
        "train": cfg.train_sbatch,
        "evaluate": cfg.eval_sbatch,
    }
    return {stage: f"{cfg.sbatch_args} {flags}".strip() for stage, flags in own.items()}


def check_requests(cfg: RoundSettings) -> None:
    """Refuse, before any job is submitted, every stage whose script header and flags no node of its
    partition can run (as `corag submit` does): one line naming each such stage and every option."""
    groups, default = node_groups()
    refused: list[tuple[str, str]] = []
    for stage, flags in stage_flags(cfg).items():
        script = Path(SCRIPTS[stage])
        try:
            check(parse_request(header_options(script.read_text()), shlex.split(flags)), groups, default)
        except InputError as e:
            refused.append((stage, f"stage {stage} ({script.name}): {e}"))
    if refused:
        field = "eval_sbatch" if refused[0][0] == "evaluate" else f"{refused[0][0]}_sbatch"
        raise InputError("; ".join(message for _, message in refused), field=field)


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


def slurm(*command: str) -> subprocess.CompletedProcess:
    """A Slurm command's output (stdout and stderr as text); no sbatch/squeue here is one line."""
    try:
        return subprocess.run(list(command), capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise InputError(f"no {command[0]} here: run corag iterate where Slurm's commands are") from None


def job_state(job: str) -> str | None:
    """The state of job `job` (the worst of an array's tasks): PENDING, RUNNING, ... while squeue lists
    it, else COMPLETED, FAILED, CANCELLED, TIMEOUT, ... from `scontrol show job`; None when Slurm does not
    know the job (ended before its MinJobAge, or never here)."""
    listed = slurm("squeue", "-h", "-j", job, "-o", "%T")
    active = [s for s in listed.stdout.split() if s in ACTIVE] if listed.returncode == 0 else []
    if active:
        return "RUNNING" if "RUNNING" in active else active[0]
    shown = slurm("scontrol", "show", "job", job, "-o")
    states = [w.split("=", 1)[1] for w in shown.stdout.split() if w.startswith("JobState=")]
    if shown.returncode != 0 or not states:
        return None
    if any(s in ACTIVE for s in states):
        return next(s for s in states if s in ACTIVE)
    bad = [s for s in states if s != "COMPLETED"]
    return bad[0] if bad else "COMPLETED"


def recorded_jobs(jobs_file: Path) -> dict[str, str]:
    """The run folder's record of each stage's job id (`jobs.json`)."""
    return json.loads(jobs_file.read_text()) if jobs_file.exists() else {}


def record_job(jobs_file: Path, key: str, job: str) -> None:
    with atomic_write(jobs_file) as f:
        json.dump({**recorded_jobs(jobs_file), key: job}, f, indent=2)


def run_job(command: list[str], jobs_file: Path, key: str) -> None:
    """Run a stage's job to its end: the job recorded for `key` in `jobs_file` when it still runs (or
    completed), else a new one submitted and recorded; JobFailed unless it ends COMPLETED."""
    script = Path(next(word for word in command if word in SCRIPTS.values())).name
    job = recorded_jobs(jobs_file).get(key)
    state = job_state(job) if job else None
    if job and state is None:
        print(
            f"[{key}] job {job} recorded in {jobs_file} is unknown to Slurm (ended long ago?): submitting anew",
            flush=True,
        )
    elif job and state in ACTIVE:
        print(
            f"[{key}] job {job} recorded in {jobs_file} is {state}: waiting for it, not submitting again",
            flush=True,
        )
    elif job and state != "COMPLETED":
        print(f"[{key}] job {job} recorded in {jobs_file} ended {state}: submitting anew", flush=True)
    if not job or state not in (*ACTIVE, "COMPLETED"):
        print(shlex.join(command), flush=True)
        done = slurm(*command)
        job = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not job.isdigit():
            message = (done.stderr.strip().splitlines() or [done.stdout.strip() or "no message"])[0]
            raise JobFailed(f"sbatch refused the job of {script} (status {done.returncode}): {message}")
        record_job(jobs_file, key, job)
        print(f"[{key}] job {job} submitted (recorded in {jobs_file})", flush=True)
    state = wait_for(job, key)
    if state != "COMPLETED":
        raise JobFailed(
            f"the job {job} of {script} ended {state} (see its Slurm .out file and logs/); "
            "run the same command again to resume it"
        )


def wait_for(job: str, key: str) -> str | None:
    """Wait until job `job` has ended, asking Slurm every CORAG_POLL_SECONDS (default 30); its final state.
    SIGTERM or SIGHUP meanwhile ends this driver with one line, the job left running."""

    def leave(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        print(
            f"corag iterate: ended by {name} while job {job} ({key}) runs; the job goes on: run the same "
            f"command again to wait for it, or scancel {job} to stop it",
            file=sys.stderr,
            flush=True,
        )
        os._exit(128 + signum)  # nothing to clean: the job and its record stay

    previous = {sig: signal.signal(sig, leave) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        poll = float(os.environ.get("CORAG_POLL_SECONDS", "30"))
        while (state := job_state(job)) in ACTIVE:
            time.sleep(poll)
        return state
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
