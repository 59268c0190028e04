"""The one Retriever protocol (batched queries in, ranked hits out) and what every index folder shares."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from corag.errors import InputError
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


def read_manifest(folder: Path, kind: str) -> dict:
    """The manifest of a finished index folder of the given kind, or an InputError saying what is wrong."""
    path = Path(folder) / "manifest.json"
    if not path.is_file():
        raise InputError(
            "no manifest.json: not an index folder (build one with `corag index`)", file=str(folder)
        )
    manifest = json.loads(path.read_text())
    if manifest.get("kind") != kind:
        raise InputError(
            f"index kind is {manifest.get('kind')!r}, expected {kind!r}", file=str(path), field="kind"
        )
    if not manifest.get("complete"):
        raise InputError("index build did not finish; re-run `corag index` to resume", file=str(path))
    return manifest
