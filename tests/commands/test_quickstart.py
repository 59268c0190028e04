"""`corag quickstart`'s parsing: its --help names every study setting."""

from __future__ import annotations

import pytest

from corag.commands import quickstart


def test_quickstart_help_lists_every_setting(capsys):
    with pytest.raises(SystemExit) as exit_:
        quickstart.main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "--warm_compile" in out and "14 percent" in out
