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
