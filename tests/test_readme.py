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
    if name == "corpus" or name == "models":  # subcommands: their own help
        args, help_args = args[1:], [name, args[0], "--help"]
    else:
        help_args = [name, "--help"]
    with pytest.raises(SystemExit):
        main(help_args)
    helped = capsys.readouterr().out
    flags = [a.split("=")[0] for a in args if a.startswith("--")]
    missing = [f for f in flags if not re.search(rf"{re.escape(f)}\b", helped)]
    assert not missing, f"corag {' '.join(words)}: {missing} not in its --help"
