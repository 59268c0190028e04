"""BM25 over `title + contents`: a streamed, memory-bounded build into bm25s's index format.

The build never holds the corpus's tokens: pass 1 tokenizes batches of passages, counts each
(passage, token) pair once and spills the counts to bucket files on disk (bucket = token id modulo
the number of buckets); pass 2 sorts one bucket at a time into the columns of bm25s's CSC score
matrix and appends them to its `.npy` files. Peak memory is the vocabulary plus one bucket. The
scores equal what `bm25s.BM25.index` computes (Lucene BM25), and the folder loads with
`bm25s.BM25.load(..., mmap=True)`, so searching reads only the columns of the query's tokens.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN
from tqdm.auto import tqdm

from corag.data.jsonl import atomic_folder
from corag.errors import InputError
from corag.retrieval.base import RowIds, read_manifest
from corag.types import Hit, Passage

_TOKEN = re.compile(r"\w+")
_STOP = frozenset(STOPWORDS_EN)
# Lucene / Elasticsearch defaults (the BM25 that IRCoT used).
K1, B = 1.2, 0.75
# (passage, token, count) as spilled in pass 1: 10 bytes a pair.
_PAIR = np.dtype([("doc", "<u4"), ("tok", "<u4"), ("tf", "<u2")])
# Pairs sorted in memory at once in pass 2 (about 30 bytes each while sorting), and pairs scored at once.
PAIRS_PER_BUCKET = 8_000_000
_SCORE_SLICE = 1 << 20


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens without English stopwords (no stemming)."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in _STOP]


def _write_npy_header(f, dtype: str, n: int) -> None:
    np.lib.format.write_array_header_2_0(f, {"descr": dtype, "fortran_order": False, "shape": (n,)})


def _spill(batches: Iterable[Sequence[Passage]], folder: Path, buckets: int):
    """Pass 1: tokens to ids, (doc, token, tf) pairs into bucket files. Returns the vocabulary, document
    frequencies, document lengths and the passage ids (None when they are the row numbers)."""
    vocab: dict[str, int] = {}
    df = np.zeros(0, np.int64)
    lengths: list[np.ndarray] = []
    ids: list[str] | None = None
    rows = 0
    files = [open(folder / f"spill-{b:04d}.bin", "wb") for b in range(buckets)]
    try:
        for batch in batches:
            start = rows
            token_ids: list[int] = []
            counts = np.zeros(len(batch), np.int32)
            for i, p in enumerate(batch):
                tokens = tokenize(f"{p.title} {p.contents}")
                counts[i] = len(tokens)
                token_ids.extend([vocab.setdefault(t, len(vocab)) for t in tokens])
                if ids is None and p.id != str(start + i):  # keep ids only once they differ from rows
                    ids = [str(r) for r in range(start + i)]
                if ids is not None:
                    ids.append(p.id)
            rows += len(batch)
            lengths.append(counts)
            if not token_ids:
                continue
            keys = (
                np.repeat(np.arange(start, start + len(batch), dtype=np.int64), counts) << 32
            ) | np.asarray(token_ids, np.int64)
            pairs_key, tf = np.unique(keys, return_counts=True)
            pairs = np.empty(len(pairs_key), _PAIR)
            pairs["doc"], pairs["tok"], pairs["tf"] = (
                pairs_key >> 32,
                pairs_key & 0xFFFFFFFF,
                np.minimum(tf, 65535),
            )
            if len(vocab) > len(df):
                df = np.concatenate([df, np.zeros(len(vocab) - len(df), np.int64)])
            df += np.bincount(pairs["tok"], minlength=len(df))
            bucket = pairs["tok"] % buckets
            order = np.argsort(bucket, kind="stable")
            bounds = np.searchsorted(bucket[order], np.arange(buckets + 1))
            for b in range(buckets):
                if bounds[b + 1] > bounds[b]:
                    files[b].write(pairs[order[bounds[b] : bounds[b + 1]]].tobytes())
    finally:
        for f in files:
            f.close()
    return vocab, df, np.concatenate(lengths) if lengths else np.zeros(0, np.int32), ids


def write_bm25_index(
    batches: Iterable[Sequence[Passage]],
    folder: str | Path,
    *,
    k1: float = K1,
    b: float = B,
    num_docs: int | None = None,
) -> dict:
    """Build the BM25 index of passages given in batches into an empty `folder`; returns its manifest.

    `num_docs` (when known) sizes the buckets so that each holds about PAIRS_PER_BUCKET pairs.
    """
    folder = Path(folder)
    buckets = max(1, min(512, math.ceil((num_docs or 0) * 80 / PAIRS_PER_BUCKET)))
    vocab, df, lengths, ids = _spill(batches, folder, buckets)
    n = len(lengths)
    if n == 0:
        raise InputError("cannot build a BM25 index over an empty corpus")
    avg_len = lengths.mean()
    idf = np.log(1 + (n - df + 0.5) / (df + 0.5)).astype(np.float32)  # Lucene idf, as bm25s
    order = np.argsort(np.arange(len(df)) % buckets, kind="stable")  # bucket by bucket
    column = np.empty(len(df), np.int64)
    column[order] = np.arange(len(df))
    indptr = np.concatenate([[0], np.cumsum(df[order])]).astype(np.int64)
    total = int(indptr[-1])

    with (
        open(folder / "data.csc.index.npy", "wb") as data,
        open(folder / "indices.csc.index.npy", "wb") as rows,
    ):
        _write_npy_header(data, "<f4", total)
        _write_npy_header(rows, "<i4", total)
        for k in tqdm(range(buckets), desc="BM25 columns", unit="bucket", disable=None):
            spill = folder / f"spill-{k:04d}.bin"
            pairs = np.fromfile(spill, _PAIR)
            spill.unlink()
            order = np.argsort((column[pairs["tok"]] << 32) | pairs["doc"], kind="stable")
            for start in range(0, len(order), _SCORE_SLICE):
                part = pairs[order[start : start + _SCORE_SLICE]]
                tf = part["tf"].astype(np.float32)
                # The same operations and dtypes as bm25s's Lucene scorer, so the scores are equal.
                tfc = tf / (k1 * ((1 - b) + b * lengths[part["doc"]] / avg_len) + tf)
                data.write((idf[part["tok"]] * tfc).astype(np.float32).tobytes())
                rows.write(part["doc"].astype("<i4").tobytes())
            del pairs, order
    np.save(folder / "indptr.csc.index.npy", indptr)
    by_column = {token: int(column[i]) for token, i in vocab.items()}
    (folder / "vocab.index.json").write_text(json.dumps(by_column, ensure_ascii=False))
    params = {"k1": k1, "b": b, "delta": 0.5, "method": "lucene", "idf_method": "lucene", "dtype": "float32"}
    params.update(int_dtype="int32", num_docs=n, version=bm25s.__version__, backend="numpy")
    (folder / "params.index.json").write_text(json.dumps(params, indent=1))
    if ids is not None:
        (folder / "ids.json").write_text(json.dumps(ids))
    return {"kind": "bm25", "k1": k1, "b": b, "corpus_size": n, "ids_are_rows": ids is None, "complete": True}


def build_bm25_folder(
    batches: Iterable[Sequence[Passage]],
    out: str | Path,
    *,
    num_docs: int | None = None,
    corpus: dict | None = None,
    **kwargs,
) -> Path:
    """Build into a temporary sibling folder and rename it into place, replacing any older index;
    `corpus` (Corpus.fingerprint) is recorded in the manifest."""
    with atomic_folder(out) as tmp:
        manifest = write_bm25_index(batches, tmp, num_docs=num_docs, **kwargs)
        if corpus is not None:
            manifest["corpus"] = corpus
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return Path(out)


def _ids(folder: Path, manifest: dict) -> Sequence[str]:
    if manifest.get("ids_are_rows"):
        return RowIds(int(manifest["corpus_size"]))
    return json.loads((folder / "ids.json").read_text())


class BM25Retriever:
    """bm25s scores over a fixed corpus; row r of the index is the passage `ids[r]`."""

    def __init__(self, model: bm25s.BM25, ids: Sequence[str]) -> None:
        self.model, self.ids = model, ids

    @classmethod
    def build(cls, batches: Iterable[Sequence[Passage]], k1: float = K1, b: float = B) -> BM25Retriever:
        """An index held in memory (tests, the toy world, small corpora): the same build, then loaded."""
        with tempfile.TemporaryDirectory(prefix="corag-bm25-") as tmp:
            manifest = write_bm25_index(batches, tmp, k1=k1, b=b)
            ids = RowIds(manifest["corpus_size"]) if manifest["ids_are_rows"] else None
            return cls._open(
                Path(tmp), mmap=False, ids=ids or json.loads((Path(tmp) / "ids.json").read_text())
            )

    @classmethod
    def from_passages(cls, passages: Sequence[Passage], k1: float = K1, b: float = B) -> BM25Retriever:
        return cls.build([passages], k1, b)

    @classmethod
    def load(cls, folder: str | Path, mmap: bool = True) -> BM25Retriever:
        """A folder written by `corag index --kind bm25`, memory-mapped by default."""
        folder = Path(folder)
        return cls._open(folder, mmap=mmap, ids=_ids(folder, read_manifest(folder, "bm25")))

    @classmethod
    def _open(cls, folder: Path, mmap: bool, ids: Sequence[str]) -> BM25Retriever:
        model = bm25s.BM25.load(folder, mmap=mmap, show_progress=False, verbosity=0)
        return cls(model, ids)

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
