"""`corag prepare-data --dataset flashrag` (corag.data.flashrag): FlashRAG_datasets and wiki-18 as
`hf download` writes them, laid out where the shipped config and the pages look for the Search-R1 suite."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from corag.cli import main as corag
from corag.data.flashrag import SUITE, WIKI18, prepare_flashrag, suite_files
from corag.data.formats import load_examples
from corag.errors import InputError

REPO = Path(__file__).resolve().parents[2]
SPLITS = {  # what FlashRAG_datasets publishes for each set (its dataset card's configs)
    "nq": ("train", "dev", "test"),
    "triviaqa": ("train", "dev", "test"),
    "popqa": ("test",),
    "hotpotqa": ("train", "dev"),
    "2wikimultihopqa": ("train", "dev"),
    "musique": ("train", "dev"),
    "bamboogle": ("test",),
}


def lines(name: str, split: str, n: int = 3) -> str:
    return "".join(
        json.dumps({"id": f"{split}_{i}", "question": f"{name} {split} {i}", "golden_answers": [f"a{i}"]})
        + "\n"
        for i in range(n)
    )


@pytest.fixture
def downloads(tmp_path) -> tuple[Path, Path]:
    root = tmp_path / "FlashRAG_datasets"
    for name, splits in SPLITS.items():
        (root / name).mkdir(parents=True)
        for split in splits:
            (root / name / f"{split}.jsonl").write_text(lines(name, split))
    wiki = tmp_path / "wiki-18" / "wiki-18.jsonl.gz"
    wiki.parent.mkdir()
    with gzip.open(wiki, "wt") as f:
        for i in range(5):
            f.write(json.dumps({"id": str(i), "contents": f'"Title {i}"\ntext {i}'}) + "\n")
    return root, wiki


def named_suite_files() -> set[str]:
    """The `data/flashrag/...` files the shipped configs, the README and the Search-R1 page name."""
    texts = [p.read_text() for p in sorted((REPO / "configs").rglob("*.yaml"))]
    texts += [(REPO / name).read_text() for name in ("README.md", "docs/methods-search-r1.md")]
    return {m for t in texts for m in re.findall(r"data/flashrag/[\w./-]+\.jsonl", t)}


def test_the_suite_is_laid_out_as_published_where_the_config_looks(downloads, tmp_path, monkeypatch, capsys):
    root, wiki = downloads
    named = named_suite_files()
    assert "data/flashrag/nq/test.jsonl" in named and "data/flashrag/wiki-18.jsonl" in named
    monkeypatch.chdir(tmp_path)
    argv = [
        "prepare-data",
        str(root),
        "--dataset",
        "flashrag",
        "--wiki18",
        str(wiki),
        "--out",
        "data/flashrag",
    ]
    assert corag(argv) == 0
    assert not [name for name in named if not (tmp_path / name).is_file()]
    for name, target in zip(SUITE, suite_files("data/flashrag"), strict=True):
        assert target.read_bytes() == (root / name / f"{SUITE[name]}.jsonl").read_bytes()  # as published
        assert {e.task for e in load_examples(target)} == {name}  # the folder tells the task
    assert sorted(p.name for p in (tmp_path / "data" / "flashrag" / "nq").iterdir()) == ["test.jsonl"]
    with gzip.open(wiki, "rb") as f:
        assert (tmp_path / "data" / "flashrag" / WIKI18).read_bytes() == f.read()
    assert "8 written, 0 up to date" in capsys.readouterr().out
    stamp = (tmp_path / "data/flashrag/nq/test.jsonl").stat().st_mtime_ns
    assert corag(argv) == 0  # a rerun rewrites nothing
    assert "0 written, 8 up to date" in capsys.readouterr().out
    assert (tmp_path / "data/flashrag/nq/test.jsonl").stat().st_mtime_ns == stamp


def test_bad_input_is_one_line_and_nothing_is_written(downloads, tmp_path):
    root, wiki = downloads
    out = tmp_path / "out"
    (root / "musique" / "dev.jsonl").write_text(
        lines("musique", "dev") + '{"id": "dev_9", "question": 3, "golden_answers": ["a"]}\n'
    )
    with pytest.raises(InputError) as err:
        prepare_flashrag(root, out, wiki18=wiki)
    assert (err.value.file, err.value.line, err.value.field) == (
        str(root / "musique" / "dev.jsonl"),
        4,
        "question",
    )
    assert not out.exists()
    (root / "musique" / "dev.jsonl").unlink()
    with pytest.raises(InputError, match='--include "musique/\\*"'):
        prepare_flashrag(root, out)
    assert not out.exists()
    prepare_flashrag(root, out, sets=["nq"])
    (out / "popqa").mkdir()
    (out / "popqa" / "test.jsonl").write_text("mine\n")
    with pytest.raises(InputError, match="was not written by `corag prepare-data`"):
        prepare_flashrag(root, out, sets=["nq", "popqa"])
    assert (out / "popqa" / "test.jsonl").read_text() == "mine\n"
    prepare_flashrag(root, out, sets=["popqa"], overwrite=True)
    assert (out / "popqa" / "test.jsonl").read_bytes() == (root / "popqa" / "test.jsonl").read_bytes()
    (tmp_path / "not-wiki.jsonl").write_text('{"title": "x"}\n')
    with pytest.raises(InputError, match="as wiki-18 is published"):
        prepare_flashrag(root, out, sets=["nq"], wiki18=tmp_path / "not-wiki.jsonl")
