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


def parse_devices(spec: str, available: int | None = None, field: str = "index_devices") -> list[str]:
    """Devices named by `spec`: `cpu` (returns []), `cuda:0-3`, `cuda:0,1`, `cuda:0-3,6` or `cuda`
    (every one of `available`). With `available` (the CUDA devices this process sees), a device beyond
    them is an InputError naming it."""
    text = spec.strip().lower()
    if text == "cpu":
        return []
    if text == "cuda":
        if available is None:
            raise InputError("`cuda` alone needs the devices this process sees; name them", field=field)
        if available == 0:
            raise InputError("no CUDA device is visible here; use cpu", field=field)
        return [f"cuda:{i}" for i in range(available)]
    if not text.startswith("cuda:"):
        raise InputError(f"expected cpu, cuda, cuda:0-3 or cuda:0,1; got {spec!r}", field=field)
    ids: list[int] = []
    for part in text[len("cuda:") :].split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise InputError(f"bad device range {part.strip()!r} in {spec!r}", field=field)
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise InputError(f"empty device range {part.strip()!r} in {spec!r}", field=field)
        ids.extend(range(first, last + 1))
    if len(set(ids)) != len(ids):
        raise InputError(f"a device is named twice in {spec!r}", field=field)
    if available is not None and (missing := [i for i in ids if i >= available]):
        seen = f"cuda:0-{available - 1}" if available else "none"
        raise InputError(
            f"device cuda:{missing[0]} does not exist (this process sees {available} CUDA device(s): {seen})",
            field=field,
        )
    return [f"cuda:{i}" for i in ids]
