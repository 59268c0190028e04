"""What the recipes share (corag/training/recipes.py): bad input found after parsing is one line too."""

from __future__ import annotations

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
