"""The `corag` command: bad input is one line on stderr and exit status 2, a traceback only on request."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from corag.cli import COMMANDS, main
from corag.errors import InputError

REPO = Path(__file__).resolve().parents[1]


def test_bad_input_is_one_line_and_status_2(tmp_path, capsys):
    missing = tmp_path / "nowhere.jsonl"
    status = main(
        ["evaluate", "--data", str(missing), "--out-dir", str(tmp_path / "out"), "--predictions", "p"]
    )
    captured = capsys.readouterr()
    assert status == 2
    assert captured.err == f"corag evaluate: error: {missing}: no such file\n"
    assert "Traceback" not in captured.err and captured.out == ""


def test_debug_flag_and_environment_show_the_traceback(tmp_path, monkeypatch):
    args = ["evaluate", "--data", str(tmp_path / "x.jsonl"), "--out-dir", str(tmp_path), "--predictions", "p"]
    with pytest.raises(InputError, match="no such file"):
        main(["--debug", *args])
    monkeypatch.setenv("CORAG_DEBUG", "1")
    with pytest.raises(InputError, match="no such file"):
        main(args)


def test_a_message_with_newlines_still_prints_as_one_line(capsys):
    from corag.cli import run_command

    def bad(argv: list[str]) -> int:
        raise InputError("first\nsecond", file="f.jsonl", line=3, field="answers")

    assert run_command("demo", bad, []) == 2
    assert capsys.readouterr().err == "corag demo: error: f.jsonl, line 3, field 'answers': first second\n"


def test_stage_scripts_go_through_the_same_wrapper(tmp_path):
    """evaluation/evaluate.py is the same command: one line, status 2, no traceback."""
    proc = subprocess.run(
        [sys.executable, "evaluation/evaluate.py", "--data", str(tmp_path), "--out-dir", str(tmp_path / "o"),
         "--predictions", "p"],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"corag evaluate: error: {tmp_path}: is a folder, not a file"]


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS) and "--debug" in out
    assert main(["no-such-command"]) == 2
