"""corag.cluster.stop: the warning before a time limit, held back from child processes and read from
the batch shell's file."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from corag.cluster.stop import StopRequest

REPO = Path(__file__).resolve().parents[2]

# A program that catches the warning and starts a child (as an engine starts its processes) while holding
# it back: then both are sent it, as srun sends it to every process of a task. Prints whether the program
# had it inside the block, whether it had it after, and the child's status (None: still running).
HOLDER = """
import contextlib, os, signal, subprocess, sys, time
from corag.cluster.stop import StopRequest, warning_held
stop = StopRequest().install()
held = sys.argv[1] == "held"
with warning_held() if held else contextlib.nullcontext():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGUSR1)
    child.send_signal(signal.SIGUSR1)
    for _ in range(50):
        if child.poll() is not None:
            break
        time.sleep(0.02)
    inside = stop.received
after = stop.received
print(inside, after, child.poll())
child.kill()
"""


@pytest.mark.parametrize("how", ["held", "not held"])
def test_processes_started_while_the_warning_is_held_never_act_on_it(how):
    done = subprocess.run(
        [sys.executable, "-c", HOLDER, how], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    inside, after, child = done.stdout.split()
    assert after == "True"  # the program takes the warning, after the block when held back
    if how == "held":
        assert (inside, child) == ("False", "None")  # the child lives on
    else:
        assert (inside, child) == ("True", str(-signal.SIGUSR1))  # the child dies of it


def test_a_stop_request_reads_the_warning_file_once_it_exists(tmp_path, monkeypatch):
    warned = tmp_path / "warned-7"
    monkeypatch.setenv("CORAG_WARNED_FILE", str(warned))
    stop = StopRequest()
    assert not stop.received
    warned.write_text("warned\n")
    assert stop.received
    warned.unlink()
    assert stop.received  # once warned, warned for good
