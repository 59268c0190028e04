"""Every command that writes refuses an output path holding what corag did not write, and leaves every
byte of it as it was: a file of the user's where the output goes, or a folder holding one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corag.cli import main

FOREIGN = "my notes: not from corag\nsecond line without a newline"


def inputs(tmp: Path, shared: Path) -> dict[str, str]:
    """Input files the commands are pointed at (most are refused before reading them)."""
    corpus = tmp / "in" / "corpus.jsonl"
    corpus.parent.mkdir()
    corpus.write_text(json.dumps({"id": "0", "title": "T", "contents": "text"}) + "\n")
    questions = tmp / "in" / "questions.jsonl"
    questions.write_text(json.dumps({"id": "q1", "query": "who?", "answers": ["x"]}) + "\n")
    return {
        "corpus": str(corpus),
        "questions": str(questions),
        "hotpot": str(shared / "hotpotqa" / "hotpot_dev_distractor_sample.json"),
        "kilt": str(shared / "kilt" / "hotpotqa-dev-kilt.sample.jsonl"),
    }


# command line, with OUT where the output path goes
COMMANDS = {
    "index dense": ["index", "{corpus}", "--out", "OUT", "--model", "minilm"],
    "index bm25 --overwrite": ["index", "{corpus}", "--out", "OUT", "--kind", "bm25", "--overwrite"],
    "corpus prepare": ["corpus", "prepare", "{corpus}", "--out", "OUT"],
    "corpus from-contexts --out": ["corpus", "from-contexts", "{hotpot}", "--out", "OUT"],
    "corpus from-contexts --questions": [
        "corpus", "from-contexts", "{hotpot}", "--out", "{tmp}/new.jsonl", "--questions", "OUT",
    ],
    "models smollm2": ["models", "smollm2", "--out", "OUT"],
    "predict": [
        "predict", "--data", "{questions}", "--model", "m", "--corpus", "{corpus}", "--retriever", "r",
        "--out", "OUT",
    ],
    "sample": [
        "sample", "--model", "m", "--questions", "{questions}", "--corpus", "{corpus}", "--retriever", "r",
        "--out_dir", "OUT",
    ],
    "merge": ["merge", "{questions}", "--questions", "{questions}", "--out", "OUT"],
    "build-examples": [
        "build-examples", "--chains", "{questions}", "--corpus", "{corpus}", "--tokenizer", "t",
        "--dataset", "OUT",
    ],
    "evaluate": ["evaluate", "--data", "{kilt}", "--predictions", "{questions}", "--out-dir", "OUT"],
    "kilt-pages": ["kilt-pages", "{corpus}", "--out", "OUT"],
    "demos": ["demos", "--toy", "{tmp}/world", "--out", "OUT"],
    "toyworld": ["toyworld", "--out", "OUT"],
    "warmstart": ["warmstart", "--out", "OUT"],
    "toystudy": ["toystudy", "--out_dir", "OUT"],
}  # fmt: skip


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("holder", ["file", "folder"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_output_holding_what_corag_did_not_write_is_refused_and_kept(
    command, holder, tmp_path, shared_data, capsys
):
    out = tmp_path / "user" / "out"
    out.parent.mkdir()
    if holder == "file":
        out.write_text(FOREIGN)
    else:
        out.mkdir()
        # In a folder of shards, sampling writes only its own shard's name.
        name = "chains-00000-of-00001.jsonl" if command == "sample" else "mine.txt"
        (out / name).write_text(FOREIGN)
    names = {**inputs(tmp_path, shared_data), "tmp": str(tmp_path)}
    argv = [str(out) if arg == "OUT" else arg.format(**names) for arg in COMMANDS[command]]
    before = snapshot(tmp_path / "user")
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "choose another" in err and str(out) in err, err
    assert snapshot(tmp_path / "user") == before
    assert sorted(p.name for p in (tmp_path / "user").iterdir()) == ["out"]  # no sibling left behind


@pytest.mark.parametrize(
    ("command", "made"),
    [
        ("predict", '{"query_id": "q1", "prediction": "x"}\n'),
        ("merge", '{"query_id": "q1", "chains": []}\n'),
        ("warmstart", '{"prompt": [], "completion": [], "task": "final", "id": "a"}\n'),
    ],
)
def test_an_output_corag_wrote_is_not_refused_as_foreign(command, made, tmp_path, shared_data, capsys):
    """The same check lets a command resume or replace its own file (it fails later, or succeeds)."""
    out = tmp_path / "out.jsonl"
    out.write_text(made)
    names = {**inputs(tmp_path, shared_data), "tmp": str(tmp_path)}
    argv = [str(out) if arg == "OUT" else arg.format(**names) for arg in COMMANDS[command]]
    main(argv)
    assert "corag did not write" not in capsys.readouterr().err
