"""The one Retriever protocol: batched queries in, ranked hits out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from corag.types import Hit


class Retriever(Protocol):
    """Anything that returns the top-k corpus ids for many queries at once."""

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """For each query, up to `k` hits sorted by descending score."""
        ...


class RowIds(Sequence[str]):
    """Ids of a corpus whose id is its row number (the KILT corpus), without a list of n strings."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [str(j) for j in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return str(i % self.n)
