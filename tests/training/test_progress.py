"""Seeing GRPO learn (corag/training/progress.py): the held-out slice answered by any evaluation method,
the rollout table's rows, and the files read back by step."""

from __future__ import annotations

import json

import pytest

from corag.data.corpus import Corpus
from corag.lm import load_lm
from corag.retrieval.bm25 import BM25Retriever
from corag.training.progress import HeldOut, append_jsonl, read_by_step, summary


@pytest.mark.parametrize("method", ["greedy:L=1", "ircot:max_sentences=1"])
def test_the_held_out_slice_takes_any_evaluation_method(method, short_model_dir, toy_world, toy_dir):
    held = HeldOut(
        toy_world.test[:2],
        method,
        Corpus.load(toy_dir / "corpus.jsonl"),
        BM25Retriever.from_passages(toy_world.passages),
    )
    rows = held.scores(load_lm(short_model_dir, backend="hf", device="cpu"))
    assert len(rows) == 2 and all(r["tokens"] > 0 and r["em"] in (0.0, 100.0) for r in rows)
    assert held.scores(load_lm(short_model_dir, backend="hf", device="cpu"), part=1, parts=2) == rows[1:]


def test_a_grid_is_refused():
    with pytest.raises(ValueError):
        HeldOut([], "greedy:L=1,2", None, None)


def test_summary_and_a_step_written_twice(tmp_path):
    rows = [{"em": 100.0, "f1": 50.0, "tokens": 10.0}, {"em": 0.0, "f1": 25.0, "tokens": 20.0}]
    assert summary(rows) == {"em": 50.0, "f1": 37.5, "tokens": 15.0}
    path = tmp_path / "heldout.jsonl"
    append_jsonl(path, [{"step": 0, "em": 1.0}, {"step": 2, "em": 2.0}])
    append_jsonl(path, [{"step": 2, "em": 3.0}])  # a run resumed before step 2's checkpoint
    assert read_by_step(path) == {0: {"step": 0, "em": 1.0}, 2: {"step": 2, "em": 3.0}}
    assert len(path.read_text().splitlines()) == 3 and json.loads(path.read_text().splitlines()[0])
