"""`corag warmstart`: its flags write warm-start examples as JSONL."""

from __future__ import annotations

import json

from corag.commands.warmstart import main


def test_main_writes_jsonl(tmp_path, capsys):
    out = tmp_path / "warm.jsonl"
    args = ["--out", str(out), "--seed", "2", "--worlds", "1", "--reading-per-world", "20"]
    args += ["--subquery-questions-per-world", "3", "--final-per-world", "2", "--exclude", "0", "1"]
    assert main(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(r["task"] == "subanswer" for r in rows) >= 18
    assert str(out) in capsys.readouterr().out
