"""What the recipes share (corag/training/recipes.py): bad input found after parsing is one line too."""

from __future__ import annotations

import os
import subprocess
import sys

RAISE = """
import sys
sys.argv[0] = "recipes/sft.py"
import corag.training.recipes
from corag.errors import InputError
raise InputError("is not an examples dataset", file="d", field="dataset")
"""


def test_an_uncaught_input_error_in_a_recipe_process_is_one_line(monkeypatch):
    """As on a rank under `accelerate launch`: no traceback in its log, exit status 2; CORAG_DEBUG keeps it."""
    monkeypatch.delenv("CORAG_DEBUG", raising=False)
    proc = subprocess.run([sys.executable, "-c", RAISE], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr == "corag train sft: error: d, field 'dataset': is not an examples dataset\n"
    monkeypatch.setenv("CORAG_DEBUG", "1")
    proc = subprocess.run([sys.executable, "-c", RAISE], capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "Traceback" in proc.stderr


def test_the_warning_signal_saves_and_stops_at_the_end_of_the_step():
    """StopOnWarning: nothing changes until SIGUSR1 comes; then the step's end saves and stops."""
    import signal

    from transformers import TrainerControl, TrainerState, TrainingArguments

    from corag.training.recipes import StopOnWarning

    previous = signal.getsignal(signal.SIGUSR1)
    try:
        callback = StopOnWarning()
        args = TrainingArguments(output_dir="unused", use_cpu=True, report_to=[])
        control = callback.on_step_end(args, TrainerState(global_step=3), TrainerControl())
        assert not (control.should_save or control.should_training_stop or callback.stopped)
        os.kill(os.getpid(), signal.SIGUSR1)  # as Slurm (or the batch shell passing it on) sends it
        control = callback.on_step_end(args, TrainerState(global_step=4), TrainerControl())
        assert control.should_save and control.should_training_stop and callback.stopped
    finally:
        signal.signal(signal.SIGUSR1, previous)
