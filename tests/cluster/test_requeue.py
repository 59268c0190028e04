"""python -m corag.cluster.requeue: the batch shell passes Slurm's warning on to its command and requeues
the job when the command stopped on it (exit status 75 or the mark file), at most CORAG_MAX_REQUEUES
times; otherwise it exits as the command did. scontrol is a stub that records its arguments."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corag.cluster.stop import STOPPED

# A command that waits for the warning signal, then writes the mark file as a torchelastic worker does
# (exit 0: the mark says it stopped), or exits 75 as a single process does.
WAITER = """
import os, signal, sys, time
from pathlib import Path
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
Path(sys.argv[1]).write_text("ready")
while not got:
    time.sleep(0.05)
if sys.argv[2] == "mark":
    Path(os.environ["CORAG_REQUEUE_FILE"]).write_text("stopped")
    sys.exit(0)
sys.exit(75)
"""


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Slurm-like environment with a stub scontrol that records its arguments in calls.txt."""
    stub = tmp_path / "bin" / "scontrol"
    stub.parent.mkdir()
    stub.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls.txt\n')
    stub.chmod(0o755)
    for name in list(os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PATH", f"{stub.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("CORAG_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.delenv("CORAG_MAX_REQUEUES", raising=False)
    return tmp_path


def requeue(*command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "corag.cluster.requeue", *command], cwd=cwd, capture_output=True, text=True
    )


def calls(tmp: Path) -> list[str]:
    path = tmp / "calls.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_a_finished_or_failed_command_is_not_requeued(job: Path):
    assert requeue(sys.executable, "-c", "pass", cwd=job).returncode == 0
    failed = requeue(sys.executable, "-c", "raise SystemExit(3)", cwd=job)
    assert failed.returncode == 3 and calls(job) == []


def test_a_stopped_command_requeues_the_job(job: Path):
    done = requeue(sys.executable, "-c", f"raise SystemExit({STOPPED})", cwd=job)
    assert done.returncode == 0 and calls(job) == ["requeue 7"]
    assert "requeueing it (1 of at most 3)" in done.stderr


def warned_once_ready(job: Path, ready: Path, command: list[str]) -> tuple[int, str]:
    """The batch shell running `command`, sent Slurm's warning once `ready` exists: (status, stderr)."""
    shell = subprocess.Popen(
        [sys.executable, "-m", "corag.cluster.requeue", *command], cwd=job, stderr=subprocess.PIPE, text=True
    )
    while not ready.exists():
        assert shell.poll() is None, shell.stderr.read()
        time.sleep(0.05)
    shell.send_signal(signal.SIGUSR1)  # Slurm's B:USR1 reaches the batch shell alone
    _, err = shell.communicate(timeout=60)
    return shell.returncode, err


@pytest.mark.parametrize("how", ["mark", "status"])
def test_the_warning_reaches_the_command_and_an_array_task_requeues_itself(
    job: Path, monkeypatch: pytest.MonkeyPatch, how: str
):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "5")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    ready = job / "ready"
    code, err = warned_once_ready(job, ready, [sys.executable, "-c", WAITER, str(ready), how])
    assert code == 0, err
    assert calls(job) == ["requeue 5_1"]  # this task, not the whole array
    assert not list((job / "logs").glob("stopped-*"))  # the mark is gone, so a rerun starts clean


# A task that ignores the warning signal, as a shell that loops over programs does, and starts its next
# program only after the warning came: that program was never sent it and reads it from the warning file.
LATE = """
trap '' USR1
touch "$1"
while [ ! -e "$CORAG_WARNED_FILE" ]; do sleep 0.05; done
exec "$2" -c 'import sys; from corag.cluster.stop import StopRequest; sys.exit(75 if StopRequest().received else 0)'
"""


def test_a_program_started_after_the_warning_reads_it_from_the_warning_file(job: Path):
    ready = job / "ready"
    code, err = warned_once_ready(job, ready, ["bash", "-c", LATE, "late", str(ready), sys.executable])
    assert code == 0, err
    assert calls(job) == ["requeue 7"]  # the late program stopped (75), so the job requeues
    assert list((job / "logs").iterdir()) == []  # the warning file is gone: the rerun starts unwarned


def test_past_the_limit_the_job_fails_in_one_line(job: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.setenv("CORAG_MAX_REQUEUES", "2")
    done = requeue(sys.executable, "-c", f"raise SystemExit({STOPPED})", cwd=job)
    assert done.returncode == STOPPED and calls(job) == []
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "after 2 requeue(s) (CORAG_MAX_REQUEUES=2)" in lines[0]
