"""Fixtures for decoding tests: the tiny model through HFLM on the toy world, a word-overlap
retriever over the toy passages, and an LM wrapper that records every call it passes on."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from corag.lm.base import Completion, GenerationRequest, Score, ScoreRequest, WrappedLM
from corag.types import Hit, Passage

_WORD = re.compile(r"\w+")


class DictCorpus:
    """Passages by id, as the chain reads them (corag.chain.CorpusLike)."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.by_id = {p.id: p for p in passages}

    def get_many(self, ids: Sequence[str]) -> list[Passage]:
        return [self.by_id[i] for i in ids]


class OverlapRetriever:
    """Ranks passages by how many distinct query words they share (ties by corpus order)."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.ids = [p.id for p in passages]
        self.words = [set(_WORD.findall(f"{p.title} {p.contents}".lower())) for p in passages]
        self.calls = 0

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.calls += 1
        out = []
        for query in queries:
            q = set(_WORD.findall(query.lower()))
            scores = [len(q & w) for w in self.words]
            order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]
            out.append([Hit(self.ids[i], float(scores[i])) for i in order])
        return out


class RecordingLM(WrappedLM):
    """Passes every call to a real LM and records requests and results (for counting and recounting)."""

    def __init__(self, lm: Any) -> None:
        super().__init__(lm)
        self.generated: list[tuple[GenerationRequest, Completion]] = []
        self.scored: list[tuple[ScoreRequest, Score]] = []
        self.batches: Counter = Counter()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self.batches["generate"] += 1
        out = self.lm.generate(requests)
        self.generated.extend(zip(requests, out, strict=True))
        return out

    def score(self, requests: Sequence[ScoreRequest]) -> list[Score]:
        self.batches["score"] += 1
        out = self.lm.score(requests)
        self.scored.extend(zip(requests, out, strict=True))
        return out


@pytest.fixture(scope="session")
def tiny_lm(tiny_model_dir):
    """The tiny random Llama through the real transformers backend."""
    from corag.lm import load_lm

    return load_lm(tiny_model_dir, backend="hf", device="cpu")


@pytest.fixture(scope="session")
def toy_corpus(toy_world) -> DictCorpus:
    return DictCorpus(toy_world.passages)


@pytest.fixture(scope="session")
def toy_retriever(toy_world) -> OverlapRetriever:
    return OverlapRetriever(toy_world.passages)


@pytest.fixture(scope="session")
def short_lm(short_model_dir):
    """The briefly trained tiny model through the real transformers backend."""
    from corag.lm import load_lm

    return load_lm(short_model_dir, backend="hf", device="cpu")


@pytest.fixture
def record():
    """Wrap an LM in a fresh RecordingLM (the test files cannot import this module)."""
    return RecordingLM
