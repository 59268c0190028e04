"""Small immutable records shared by every stage."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Passage:
    """One retrievable document: `id` is its key in the corpus (a row number for the KILT corpus)."""

    id: str
    title: str
    contents: str


@dataclass(frozen=True)
class Hit:
    """One search result: a corpus id and its retrieval score (higher is better)."""

    doc_id: str
    score: float


@dataclass(frozen=True)
class Step:
    """One link of a retrieval chain: a sub-query, the documents it retrieved, and its sub-answer."""

    subquery: str
    subanswer: str
    doc_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Example:
    """A question with its gold answers (first is the canonical one, the rest aliases; none for a
    test set).

    `supporting_ids` are corpus ids of gold passages (passage ids: rows of the searched corpus) where
    they are known, `supporting_pages` Wikipedia page ids of the gold evidence (KILT's provenance), a
    different kind of id that is never compared with passage ids; `supporting_titles` are the gold
    pages' titles (HotpotQA and 2Wiki name gold passages by title). `decomposition` holds a gold chain
    where the dataset has one (MuSiQue, the toy world).
    """

    id: str
    query: str
    answers: tuple[str, ...]
    task: str = "multihopqa"
    supporting_ids: tuple[str, ...] = ()
    supporting_titles: tuple[str, ...] = ()
    supporting_pages: tuple[str, ...] = ()
    decomposition: tuple[Step, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Chain:
    """A finished retrieval chain and, once written, its final answer."""

    steps: tuple[Step, ...] = ()
    final_answer: str | None = None

    @property
    def subqueries(self) -> list[str]:
        return [s.subquery for s in self.steps]

    @property
    def subanswers(self) -> list[str]:
        return [s.subanswer for s in self.steps]


@dataclass(frozen=True)
class Usage:
    """Tokens metered for model calls: each call's prompt once (however many samples it draws) plus
    the generated tokens of every sample, as the CoRAG release counts them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.calls + other.calls,
        )
