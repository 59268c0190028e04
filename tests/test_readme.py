"""The README's commands: every `corag` command it shows exists and every flag it passes is one the
command takes (read from the command's own --help)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from corag.cli import COMMANDS, main

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_commands() -> list[list[str]]:
    """Each `corag ...` command line of the README's bash blocks, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    commands = []
    for line in lines:
        words = shlex.split(line, comments=True)
        while words and "=" in words[0]:  # VAR=value prefixes
            words = words[1:]
        if words[:1] == ["corag"]:
            commands.append(words[1:])
    return commands


def test_the_readme_shows_commands() -> None:
    assert len(readme_commands()) >= 15


@pytest.mark.parametrize("words", readme_commands(), ids=lambda w: " ".join(w[:3]))
def test_every_readme_command_and_flag_exists(words: list[str], capsys) -> None:
    name = words[0]
    assert name in COMMANDS
    args = words[1:]
    if name in ("corpus", "models", "train"):  # subcommands: their own help
        args, help_args = args[1:], [name, args[0], "--help"]
    else:
        help_args = [name, "--help"]
    with pytest.raises(SystemExit):
        main(help_args)
    helped = capsys.readouterr().out
    flags = [a.split("=")[0] for a in args if a.startswith("--")]
    missing = [f for f in flags if not re.search(rf"{re.escape(f)}\b", helped)]
    assert not missing, f"corag {' '.join(words)}: {missing} not in its --help"


def sbatch_commands(text: str) -> list[tuple[str, set[str]]]:
    """Each `sbatch` command line in `text` (continuation lines joined): its script and its flags."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["sbatch"]:
            script = next(w for w in words if w.endswith(".sh"))
            commands.append((script, {w.split("=")[0] for w in words if w.startswith("--")}))
    return commands


def test_the_simulated_cluster_run_submits_what_the_readme_shows() -> None:
    """tests/slurm/run.sh (CI) submits every sbatch command of the README's bash blocks: the same script
    with at least the same flags (it adds the resources of its fake nodes)."""
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL))
    shown = sbatch_commands(blocks)
    run = sbatch_commands((README.parent / "tests" / "slurm" / "run.sh").read_text())
    assert {script for script, _ in shown} == {
        "sampling/slurm_array.sh", "recipes/slurm_train.sh", "evaluation/slurm_eval.sh"
    }  # fmt: skip
    for script, flags in shown:
        assert any(s == script and flags <= f for s, f in run), (script, flags)
