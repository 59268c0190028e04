"""The stop/requeue protocol of jobs that outlive their time limit. Slurm sends SIGUSR1 some minutes before a
job's limit (`#SBATCH --signal=B:USR1@SECONDS`). A long program (a sampling shard, an evaluation, a
training process) installs `StopRequest`, finishes the unit of work in hand (a block of questions, a
question, an optimizer step), saves it, and returns `stopped(...)`: exit status 75 and, where the job's
batch shell asks for it (CORAG_REQUEUE_FILE, set by `python -m corag.cluster.requeue`), a mark file on
the shared file system that says the same where a launcher does not pass the status on (torchelastic
reports a worker's non-zero status as a failure). The batch shell then requeues the job, and the rerun
resumes from what was saved. The batch shell also leaves a warning file (CORAG_WARNED_FILE) the moment the
warning comes: a program that started too late to be sent the signal (the next file of an evaluation
part, one whose handler was not yet installed) reads the warning from it."""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

STOPPED = 75  # the exit status of a program stopped early on the warning signal (EX_TEMPFAIL: run it again)
WARNING_SIGNAL = signal.SIGUSR1
MARK_ENV = "CORAG_REQUEUE_FILE"
WARNED_ENV = "CORAG_WARNED_FILE"


class StopRequest:
    """Set once the warning signal arrives, or once the batch shell's warning file exists (CORAG_WARNED_FILE:
    the signal is lost on a program that starts after it came, or before its handler is installed); the
    program stops at its next safe point."""

    def __init__(self) -> None:
        self._received = False
        self.warned_file = os.environ.get(WARNED_ENV)

    @property
    def received(self) -> bool:
        if not self._received and self.warned_file and os.path.exists(self.warned_file):
            self._received = True
        return self._received

    @received.setter
    def received(self, value: bool) -> None:
        self._received = value

    def install(self) -> StopRequest:
        """Catch the warning signal from now on (also where the launcher left it ignored)."""
        signal.signal(WARNING_SIGNAL, self._receive)
        return self

    def _receive(self, signum: int, frame: object) -> None:
        self.received = True


@contextmanager
def warning_held() -> Iterator[None]:
    """Hold the warning signal back in this thread while the block runs (one that comes is taken after
    it): processes started meanwhile, such as an inference engine's, inherit it blocked and never act on
    it, where srun passes it to every process of a task."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {WARNING_SIGNAL})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def stopped(what: str) -> int:
    """Say that this program stopped early on the warning signal, `what` having been saved: one line on
    stderr, the mark file written when the batch shell asked for one; the exit status to end with."""
    print(f"stopped on the warning signal after {what}; run again to go on", file=sys.stderr)
    mark = os.environ.get(MARK_ENV)
    if mark:
        Path(mark).parent.mkdir(parents=True, exist_ok=True)
        Path(mark).write_text(f"{socket.gethostname()} {os.getpid()}\n")
    return STOPPED


def job_tag(env: Mapping[str, str]) -> str | None:
    """The Slurm job this runs in, as logs name it and scontrol takes it: ARRAY_TASK for an array task,
    else the job id; None outside Slurm."""
    if "SLURM_ARRAY_JOB_ID" in env and "SLURM_ARRAY_TASK_ID" in env:
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")
