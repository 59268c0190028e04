"""`corag index`: encode a corpus into a dense index (resumable), or build a BM25 index.

A dense build encodes the corpus in fixed-size chunks. Each chunk is written atomically to
`chunks/NNNNNN-HASH.npy`, where HASH fingerprints the chunk's ids and texts, so a re-run after an
interruption skips every finished chunk and refuses a corpus that changed underneath it. When all
chunks exist they are assembled into `index.faiss`; `manifest.json` (written last) marks the folder
complete.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from corag.errors import InputError
from corag.retrieval.dense import Encoder, FaissIndex, passage_text, resolve_model
from corag.types import Passage

if TYPE_CHECKING:
    from corag.data.corpus import Corpus

CHUNK_DIR = "chunks"


def atomic_write(path: Path, write: Callable[[object], None]) -> None:
    """Write a file through a temporary sibling and rename it, so readers never see half a file."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: object) -> None:
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=1).encode()))


def chunk_hash(passages: Sequence[Passage]) -> str:
    """Fingerprint of one chunk: every id and the exact text that gets embedded."""
    h = hashlib.sha256()
    for p in passages:
        h.update(p.id.encode() + b"\0" + passage_text(p).encode() + b"\0")
    return h.hexdigest()[:16]


def _settings(encoder: Encoder, corpus_size: int, chunk_size: int, dtype: str) -> dict:
    return {
        "kind": "dense",
        "model": encoder.name,
        "query_prefix": encoder.query_prefix,
        "passage_prefix": encoder.passage_prefix,
        "query_max_length": encoder.query_max_length,
        "dim": encoder.dim,
        "dtype": dtype,
        "chunk_size": chunk_size,
        "corpus_size": corpus_size,
    }


def _check_resumable(out: Path, settings: dict) -> None:
    """A folder holding another build's chunks must not be mixed with this one."""
    path = out / "manifest.json"
    if not path.exists():
        return
    old = json.loads(path.read_text())
    for key, value in settings.items():
        if old.get(key) != value:
            raise InputError(
                f"folder holds an index built with {key}={old.get(key)!r}, this build has {value!r}; "
                "use another folder or --overwrite",
                file=str(path),
                field=key,
            )


def build_dense(
    corpus: Corpus,
    out: str | Path,
    encoder: Encoder,
    chunk_size: int = 8192,
    dtype: str = "float32",
    overwrite: bool = False,
) -> Path:
    """Encode `corpus` (a corag.data.corpus.Corpus) into `out`, resuming from chunks already there."""
    out = Path(out)
    if overwrite and out.exists():
        shutil.rmtree(out)
    chunks = out / CHUNK_DIR
    chunks.mkdir(parents=True, exist_ok=True)
    for tmp in chunks.glob(".tmp-*"):  # left by a killed run
        tmp.unlink()
    n = len(corpus)
    if n == 0:
        raise InputError("cannot index an empty corpus", file=corpus.name)
    settings = _settings(encoder, n, chunk_size, dtype)
    _check_resumable(out, settings)
    write_json(out / "manifest.json", {**settings, "complete": False})
    store = np.float16 if dtype == "float16" else np.float32

    hashes, done = [], 0
    bar = tqdm(
        corpus.iter_batches(chunk_size), total=-(-n // chunk_size), desc="encoding chunks", unit="chunk"
    )
    for i, batch in enumerate(bar):
        h = chunk_hash(batch)
        hashes.append(h)
        path = chunks / f"{i:06d}-{h}.npy"
        if path.exists():
            done += 1
            continue
        stale = list(chunks.glob(f"{i:06d}-*.npy"))
        if stale:
            raise InputError(
                f"chunk {i} was encoded from different passages (ids {batch[0].id!r}..{batch[-1].id!r} changed); "
                "use another folder or --overwrite",
                file=str(stale[0]),
            )
        vectors = encoder.encode_passages(batch).astype(store)
        atomic_write(path, lambda f, v=vectors: np.save(f, v))
    bar.close()
    if done:
        print(f"reused {done} finished chunk(s) of {len(hashes)}")

    fingerprint = hashlib.sha256("".join(hashes).encode()).hexdigest()[:32]
    index = FaissIndex.empty(encoder.dim, dtype)
    for i, h in enumerate(tqdm(hashes, desc="assembling index", unit="chunk")):
        index.add(np.load(chunks / f"{i:06d}-{h}.npy").astype(np.float32))
    _save_faiss(index, out / "index.faiss")
    ids_are_rows = _write_ids(out, corpus.ids)
    write_json(
        out / "manifest.json",
        {
            **settings,
            "num_chunks": len(hashes),
            "corpus_fingerprint": fingerprint,
            "ids_are_rows": ids_are_rows,
            "complete": True,
        },
    )
    return out


def _save_faiss(index: FaissIndex, path: Path) -> None:
    tmp = path.with_name(".tmp-" + path.name)
    index.save(tmp)
    os.replace(tmp, path)


def _write_ids(out: Path, ids: Sequence[str]) -> bool:
    """Store row -> id; a corpus whose ids are its row numbers needs no file."""
    if all(x == str(i) for i, x in enumerate(ids)):
        (out / "ids.json").unlink(missing_ok=True)
        return True
    write_json(out / "ids.json", list(ids))
    return False


def build_bm25(corpus: Corpus, out: str | Path, overwrite: bool = False) -> Path:
    """Build and save a BM25 index over `title + contents` of every passage."""
    from corag.retrieval.bm25 import BM25Retriever

    out = Path(out)
    if (out / "manifest.json").exists() and not overwrite:
        raise InputError("folder already holds an index; use --overwrite", file=str(out))
    retriever = BM25Retriever.build(
        tqdm(corpus.iter_batches(8192), total=-(-len(corpus) // 8192), desc="tokenizing", unit="chunk")
    )
    retriever.save(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="corag index", description=__doc__.splitlines()[0])
    ap.add_argument("corpus", help="corpus file (.jsonl or .parquet) or saved dataset folder")
    ap.add_argument(
        "--out", required=True, help="index folder (created; resumed if it holds a partial build)"
    )
    ap.add_argument("--kind", choices=["dense", "bm25"], default="dense")
    ap.add_argument("--model", default="e5-large-v2", help="preset (e5-large-v2, e5-base-v2, minilm) or path")
    ap.add_argument("--query-prefix", default=None, help="overrides the preset's query prefix")
    ap.add_argument("--passage-prefix", default=None, help="overrides the preset's passage prefix")
    ap.add_argument("--query-max-length", type=int, default=None, help="query tokens kept (E5: 64)")
    ap.add_argument("--chunk-size", type=int, default=8192, help="passages per saved chunk")
    ap.add_argument("--batch-size", type=int, default=64, help="encoder batch size")
    ap.add_argument("--dtype", choices=["float32", "float16"], default="float32", help="stored vector type")
    ap.add_argument("--device", default=None, help="encoder device (default: GPU if present)")
    ap.add_argument("--overwrite", action="store_true", help="delete the folder's contents first")
    args = ap.parse_args(argv)

    from corag.data.corpus import Corpus

    corpus = Corpus.load(args.corpus)
    if args.kind == "bm25":
        out = build_bm25(corpus, args.out, overwrite=args.overwrite)
    else:
        model, qp, pp, qmax = resolve_model(args.model)
        encoder = Encoder(
            model,
            qp if args.query_prefix is None else args.query_prefix,
            pp if args.passage_prefix is None else args.passage_prefix,
            qmax if args.query_max_length is None else args.query_max_length,
            device=args.device,
            batch_size=args.batch_size,
        )
        out = build_dense(corpus, args.out, encoder, args.chunk_size, args.dtype, overwrite=args.overwrite)
    print(f"{args.kind} index of {len(corpus)} passages written to {out}")
    return 0
