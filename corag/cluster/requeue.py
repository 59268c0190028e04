"""The batch shell of a job that requeues itself at its time limit (python -m corag.cluster.requeue).

    #SBATCH --signal=B:USR1@900
    #SBATCH --requeue
    #SBATCH --open-mode=append
    ...
    exec python -m corag.cluster.requeue COMMAND [ARGS ...]

Runs COMMAND (srun, or a launcher on this node) with CORAG_REQUEUE_FILE and CORAG_WARNED_FILE set.
Slurm's warning (SIGUSR1, sent to the batch shell alone with `B:`) is passed on to COMMAND, whose programs
finish the work in hand, save it and stop (corag.cluster.stop.stopped: exit status 75, the mark file); the
warning file, written first, tells it to a program that starts later (corag.cluster.stop.StopRequest). Then the
job requeues itself (`scontrol requeue`: the same job id, SLURM_RESTART_COUNT one higher) and the rerun
resumes; after CORAG_MAX_REQUEUES requeues (default 3) it fails in one line instead. Otherwise it exits as
COMMAND did.
The mark file is `$CORAG_LOG_DIR/stopped-<job>` (logs/ by default) and the warning file
`$CORAG_LOG_DIR/warned-<job>`, on the file system every node shares; both are removed as the job ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from corag.cluster.stop import MARK_ENV, STOPPED, WARNED_ENV, WARNING_SIGNAL, job_tag

PROG = "requeue"


def say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def max_requeues(env: Mapping[str, str]) -> int:
    """CORAG_MAX_REQUEUES (default 3): how often a job may requeue itself."""
    text = env.get("CORAG_MAX_REQUEUES", "3")
    if not text.isdigit():
        say(f"error: CORAG_MAX_REQUEUES is a whole number, not {text!r}")
        raise SystemExit(2)
    return int(text)


def run(command: list[str], env: dict[str, str]) -> tuple[int, bool]:
    """COMMAND's exit status, and whether the warning signal came while it ran (passed on to it, after the
    warning file is written)."""
    warned = False
    child: subprocess.Popen | None = None

    def forward(signum: int, frame: object) -> None:
        nonlocal warned
        warned = True
        say("the time limit is near: asking the job to save what it has and stop")
        Path(env[WARNED_ENV]).write_text("warned\n")
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(WARNING_SIGNAL, forward)
    child = subprocess.Popen(command, env=env)
    return child.wait(), warned


def requeue(env: Mapping[str, str]) -> int:
    """Requeue this job, unless it already ran its CORAG_MAX_REQUEUES requeues; the exit status."""
    tag = job_tag(env)
    if tag is None:
        say("error: stopped on the warning signal outside a Slurm job; run the same command again to go on")
        return STOPPED
    done, limit = int(env.get("SLURM_RESTART_COUNT") or 0), max_requeues(env)
    if done >= limit:
        say(
            f"error: job {tag} stopped at its time limit after {done} requeue(s) (CORAG_MAX_REQUEUES={limit}); "
            "not requeued again: resubmit the same command to go on"
        )
        return STOPPED
    say(f"job {tag} saved its work and stopped: requeueing it ({done + 1} of at most {limit})")
    code = subprocess.run(["scontrol", "requeue", tag]).returncode
    if code != 0:
        say(f"error: scontrol requeue {tag} failed (status {code}); resubmit the same command to go on")
        return STOPPED
    return 0


def main(argv: list[str] | None = None) -> int:
    command = list(sys.argv[1:] if argv is None else argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        say("usage: python -m corag.cluster.requeue COMMAND [ARGS ...]")
        return 2
    env = dict(os.environ)
    log_dir, tag = Path(env.get("CORAG_LOG_DIR", "logs")), job_tag(env) or str(os.getpid())
    mark, warned_file = log_dir / f"stopped-{tag}", log_dir / f"warned-{tag}"
    log_dir.mkdir(parents=True, exist_ok=True)
    for path in (mark, warned_file):  # left by a run of this job that was killed
        path.unlink(missing_ok=True)
    env[MARK_ENV], env[WARNED_ENV] = str(mark.resolve()), str(warned_file.resolve())
    code, warned = run(command, env)
    # A command the warning reached as it exited (its own handler gone) stopped on it too.
    stopped = code == STOPPED or (warned and code == -WARNING_SIGNAL) or mark.exists()
    for path in (mark, warned_file):
        path.unlink(missing_ok=True)
    if stopped:
        return requeue(env)
    if warned and code == 0:
        say("the job finished before it had to stop")
    return code


if __name__ == "__main__":
    sys.exit(main())
