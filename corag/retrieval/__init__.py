"""Retrieval: BM25, dense exact search, index building, and an HTTP service for many workers."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from corag.errors import InputError
from corag.retrieval.base import Retriever


def index_fingerprint(source: str | Path) -> str:
    """What identifies an index wherever it lives: a hash of its folder's manifest (its kind, model,
    settings and corpus), or for a service URL the fingerprint its /health reports ("" if none)."""
    text = str(source)
    if text.startswith(("http://", "https://")):
        from corag.retrieval.client import RetrieverClient

        with RetrieverClient(text, retries=0) as client:
            return client.fingerprint()
    manifest = Path(source) / "manifest.json"
    if not manifest.is_file():
        raise InputError("no manifest.json: not an index folder (build one with `corag index`)", file=text)
    return hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]


def check_corpus(source: str | Path, corpus: Any) -> None:
    """Refuse an index folder built over another corpus than `corpus` (its hits would name other
    passages): the row count and a hash of sampled rows, as `corag index` recorded them. Commands call it
    before any model loads; a service URL, or an index from before indexes recorded their corpus, passes."""
    manifest = Path(source) / "manifest.json"
    if str(source).startswith(("http://", "https://")) or not manifest.is_file():
        return
    built = json.loads(manifest.read_text()).get("corpus")
    if built is None:
        return
    found = corpus.fingerprint()
    if found != built:
        raise InputError(
            f"the index was built over another corpus ({built['rows']} passages, sample hash "
            f"{built['sample_sha256'][:8]}) than the one given ({found['rows']} passages, sample hash "
            f"{found['sample_sha256'][:8]}): give the index's own corpus, or build an index over this one",
            file=str(manifest),
            field="corpus",
        )


def load_retriever(
    source: str | Path, device: str | None = None, index_devices: str | None = None, **kwargs
) -> Retriever:
    """A retriever from an index folder (`corag index`, dense or bm25) or a service URL (http://...).

    `index_devices` places a dense index's exact shards (`cuda:0-3`, `cuda:0,1`, `cpu`; default: every
    visible GPU); a service holds its own index, and BM25 searches on the CPU, so both ignore it."""
    text = str(source)
    if text.startswith(("http://", "https://")):
        from corag.retrieval.client import RetrieverClient

        return RetrieverClient(text, **kwargs)
    manifest = Path(source) / "manifest.json"
    if not manifest.is_file():
        raise InputError("no manifest.json: not an index folder (build one with `corag index`)", file=text)
    kind = json.loads(manifest.read_text()).get("kind")
    if kind == "bm25":
        from corag.retrieval.bm25 import BM25Retriever

        return BM25Retriever.load(source, **kwargs)
    if kind == "dense":
        from corag.retrieval.dense import load_dense

        return load_dense(source, device=device, index_devices=index_devices, **kwargs)
    raise InputError(f"unknown index kind {kind!r}", file=str(manifest), field="kind")


__all__ = ["Retriever", "check_corpus", "index_fingerprint", "load_retriever"]
