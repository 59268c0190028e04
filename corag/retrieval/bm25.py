"""BM25 retrieval with bm25s over `title + contents`, saved to and loaded from a folder."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN

from corag.errors import InputError
from corag.retrieval import read_manifest
from corag.types import Hit, Passage

_TOKEN = re.compile(r"\w+")
_STOP = frozenset(STOPWORDS_EN)
# Lucene / Elasticsearch defaults (the BM25 that IRCoT used).
K1, B = 1.2, 0.75


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens without English stopwords (no stemming)."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in _STOP]


class BM25Retriever:
    """bm25s scores over a fixed corpus; row r of the index is the passage `ids[r]`."""

    def __init__(self, model: bm25s.BM25, ids: Sequence[str]) -> None:
        self.model, self.ids = model, list(ids)

    @classmethod
    def build(cls, batches: Iterable[Sequence[Passage]], k1: float = K1, b: float = B) -> BM25Retriever:
        """Index passages given in batches (e.g. `Corpus.iter_batches`) so tokens are mapped as they stream."""
        vocab: dict[str, int] = {}
        docs: list[list[int]] = []
        ids: list[str] = []
        for batch in batches:
            for p in batch:
                ids.append(p.id)
                docs.append([vocab.setdefault(t, len(vocab)) for t in tokenize(f"{p.title} {p.contents}")])
        if not ids:
            raise InputError("cannot build a BM25 index over an empty corpus")
        model = bm25s.BM25(k1=k1, b=b)
        model.index((docs, vocab), show_progress=False)
        return cls(model, ids)

    @classmethod
    def from_passages(cls, passages: Sequence[Passage], k1: float = K1, b: float = B) -> BM25Retriever:
        return cls.build([passages], k1, b)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Top-k passages per query; passages sharing no token with the query are left out."""
        if k < 1 or not queries:
            return [[] for _ in queries]
        known = self.model.vocab_dict
        tokens = [[t for t in tokenize(q) if t in known] for q in queries]
        rows, scores = self.model.retrieve(tokens, k=min(k, len(self.ids)), show_progress=False, n_threads=0)
        return [
            [Hit(self.ids[r], float(s)) for r, s in zip(rrow, srow, strict=True) if s > 0]
            for rrow, srow in zip(np.asarray(rows).tolist(), np.asarray(scores).tolist(), strict=True)
        ]

    def save(self, folder: str | Path) -> None:
        """Write the index beside `folder` and rename it into place, replacing any older index."""
        folder = Path(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-" + folder.name, dir=folder.parent))
        try:
            self.model.save(tmp / "bm25", show_progress=False)
            (tmp / "ids.json").write_text(json.dumps(self.ids))
            manifest = {"kind": "bm25", "k1": self.model.k1, "b": self.model.b, "corpus_size": len(self.ids)}
            (tmp / "manifest.json").write_text(json.dumps({**manifest, "complete": True}, indent=1))
            if folder.exists():
                old = folder.with_name(".old-" + folder.name)
                shutil.rmtree(old, ignore_errors=True)
                folder.rename(old)
                tmp.rename(folder)
                shutil.rmtree(old)
            else:
                tmp.rename(folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def load(cls, folder: str | Path, mmap: bool = False) -> BM25Retriever:
        folder = Path(folder)
        read_manifest(folder, "bm25")
        model = bm25s.BM25.load(folder / "bm25", mmap=mmap, show_progress=False, verbosity=0)
        return cls(model, json.loads((folder / "ids.json").read_text()))
