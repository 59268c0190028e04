"""Dense indexes (encoded, sharded over processes, or imported) and BM25 indexes, as `corag index` makes them.

A dense index folder holds its vectors as chunks `chunks/NNNNNN-NAME.npy` (row r of their
concatenation is corpus row r) and `manifest.json`, written last, which lists them and marks the
folder complete. Encoding writes one chunk of `chunk_size` passages at a time, atomically, named by a
hash of the chunk's ids and texts: a re-run skips finished chunks and refuses a corpus that changed.
`--shard i --num-shards n` encodes the i-th contiguous range of chunks (one process per GPU or node,
all writing into the same folder); `--merge` checks that every chunk exists and completes the folder.
`--from-embeddings DIR` imports precomputed embeddings laid out as the released CoRAG ones
(`NAME-shard-{0..S-1}.pt`, each a [rows, dim] tensor, concatenated in shard order) instead;
`--from-faiss FILE` a flat faiss index (Search-R1's and FlashRAG's `e5_Flat.index`), block by block.
`--approx KIND` adds an approximate faiss index (IVF-Flat, IVF-PQ, HNSW) and reports its recall
against exact search. `--skip-empty` leaves passages without title and contents out of an encoded or
BM25 index: each chunk then holds the non-empty passages of its rows, `ids.json` names every row, and
the manifest counts the passages left out (`skipped_empty`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from corag.data.jsonl import atomic_write
from corag.errors import InputError
from corag.retrieval.dense import (
    Encoder,
    ExactIndex,
    index_chunks,
    passage_text,
    read_npy_shape,
)
from corag.types import Passage

if TYPE_CHECKING:
    from corag.data.corpus import Corpus

CHUNK_DIR = "chunks"
DEFAULT_CHUNK_SIZE = 65_536
_SHARD_FILE = re.compile(r"^(?P<stem>.+)-shard-(?P<index>\d+)\.pt$")


def write_json(path: Path, obj: object) -> None:
    with atomic_write(path) as f:
        f.write(json.dumps(obj, indent=1))


def chunk_hash(passages: Sequence[Passage]) -> str:
    """Fingerprint of one chunk: every id and the exact text that gets embedded."""
    h = hashlib.sha256()
    for p in passages:
        h.update(p.id.encode() + b"\0" + passage_text(p).encode() + b"\0")
    return h.hexdigest()[:16]


def _settings(encoder: Encoder, corpus: Corpus, dtype: str, source: dict) -> dict:
    return {
        "kind": "dense",
        "model": encoder.name,
        "query_prefix": encoder.query_prefix,
        "passage_prefix": encoder.passage_prefix,
        "query_max_length": encoder.query_max_length,
        "dim": encoder.dim,
        "dtype": dtype,
        "corpus_size": len(corpus),
        **source,
    }


def _replaced(out: Path) -> Path:
    """Where an index that --overwrite replaces waits until the new one is complete."""
    return out.with_name(f".{out.name}.replaced")


def _start(out: Path, settings: dict, overwrite: bool) -> Path:
    """Create (or reuse) the folder for a build with `settings`; a folder holding another build's
    chunks must not be mixed with this one. With `overwrite` the old index is moved aside, and removed
    only once the new one is complete (`_finish`); a rebuild interrupted again keeps the same old one."""
    if overwrite and out.exists():
        if _replaced(out).exists():  # an earlier rebuild's unfinished folder
            shutil.rmtree(out)
        else:
            out.rename(_replaced(out))
    chunks = out / CHUNK_DIR
    chunks.mkdir(parents=True, exist_ok=True)
    for tmp in chunks.glob(".tmp-*"):  # left by a killed run
        tmp.unlink(missing_ok=True)
    path = out / "manifest.json"
    if path.exists():
        old = json.loads(path.read_text())
        for key, value in settings.items():
            if old.get(key) != value:
                raise InputError(
                    f"folder holds an index built with {key}={old.get(key)!r}, this build has {value!r}; "
                    "use another folder or --overwrite",
                    file=str(path),
                    field=key,
                )
        if old.get("complete"):
            return chunks
    write_json(path, {**settings, "complete": False})
    return chunks


def _store(vectors: np.ndarray, dtype: str) -> np.ndarray:
    return np.ascontiguousarray(vectors, dtype=np.float16 if dtype == "float16" else np.float32)


def is_complete(out: Path, settings: dict) -> bool:
    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(manifest.get("complete")) and all(manifest.get(k) == v for k, v in settings.items())


def shard_chunks(num_chunks: int, shard: int, num_shards: int) -> range:
    """The contiguous range of chunk numbers that shard `shard` of `num_shards` encodes."""
    if not 0 <= shard < num_shards:
        raise InputError(f"shard {shard} is not in 0..{num_shards - 1}", field="shard")
    return range(shard * num_chunks // num_shards, (shard + 1) * num_chunks // num_shards)


def _kept(corpus: Corpus, start: int, stop: int, skip_empty: bool) -> np.ndarray | None:
    """The rows start..stop-1 an index keeps: None for all of them, else those with some text."""
    if not skip_empty:
        return None
    rows = np.arange(start, min(stop, len(corpus)))
    return np.setdiff1d(rows, corpus.empty_rows(start, stop), assume_unique=True)


def build_dense(
    corpus: Corpus,
    out: str | Path,
    encoder: Encoder,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    dtype: str = "float16",
    overwrite: bool = False,
    shard: int = 0,
    num_shards: int = 1,
    skip_empty: bool = False,
) -> Path:
    """Encode shard `shard` of `num_shards` of `corpus` into `out`, resuming from chunks already there;
    with one shard (the default) the folder is completed at the end (see `merge_dense`). With
    `skip_empty`, passages without title and contents are left out."""
    out = Path(out)
    if len(corpus) == 0:
        raise InputError("cannot index an empty corpus", file=corpus.name)
    source = {"source": "encode", "chunk_size": chunk_size, **({"skip_empty": True} if skip_empty else {})}
    settings = _settings(encoder, corpus, dtype, source)
    if not overwrite and is_complete(out, {**settings, "corpus_sources": _corpus_sources(corpus)}):
        print(f"{out} is already complete")
        return out
    chunks = _start(out, settings, overwrite)
    num_chunks = math.ceil(len(corpus) / chunk_size)
    mine = shard_chunks(num_chunks, shard, num_shards)
    rows = min(mine.stop * chunk_size, len(corpus)) - mine.start * chunk_size
    bar = tqdm(total=rows, desc=f"encoding shard {shard}/{num_shards}", unit=" passages", disable=None)
    done = 0
    for i in mine:
        batch = next(corpus.iter_batches(chunk_size, start=i * chunk_size, stop=(i + 1) * chunk_size))
        kept = _kept(corpus, i * chunk_size, (i + 1) * chunk_size, skip_empty)
        rows_read = len(batch)
        if kept is not None:
            batch = [batch[r] for r in (kept - i * chunk_size).tolist()]
        h = chunk_hash(batch)
        path = chunks / f"{i:06d}-{h}.npy"
        if not path.exists():
            stale = list(chunks.glob(f"{i:06d}-*.npy"))
            if stale:
                raise InputError(
                    f"chunk {i} was encoded from different passages (ids {batch[0].id!r}..{batch[-1].id!r} "
                    "changed); use another folder or --overwrite",
                    file=str(stale[0]),
                )
            vectors = encoder.encode_passages(batch) if batch else np.zeros((0, encoder.dim), np.float32)
            with atomic_write(path, "wb") as f:
                np.save(f, _store(vectors, dtype))
        else:
            done += 1
        bar.update(rows_read)
    bar.close()
    if done:
        print(f"reused {done} finished chunk(s) of {len(mine)}")
    if num_shards == 1:
        return merge_dense(corpus, out, skip_empty)
    print(
        f"shard {shard} of {num_shards} written to {out}; once every shard is, run the same command with --merge"
    )
    return out


def _corpus_sources(corpus: Corpus) -> list:
    return json.loads((corpus.store / "store.json").read_text()).get("sources", [])


def merge_dense(corpus: Corpus, out: str | Path, skip_empty: bool = False) -> Path:
    """Complete an encoded index folder: one chunk file for every chunk number, each of the right size
    (the shards' `skip_empty` must be this one's)."""
    out = Path(out)
    path = out / "manifest.json"
    if not path.is_file():
        raise InputError("no manifest.json: no build was started in this folder", file=str(out))
    manifest = json.loads(path.read_text())
    if bool(manifest.get("skip_empty")) != skip_empty:
        started = "with" if manifest.get("skip_empty") else "without"
        raise InputError(f"the build was started {started} --skip-empty", file=str(path), field="skip_empty")
    if manifest.get("corpus_size") != len(corpus):
        raise InputError(
            f"the index was started for {manifest.get('corpus_size')} passages, the corpus has {len(corpus)}",
            file=str(path),
            field="corpus_size",
        )
    chunk_size, dim = int(manifest["chunk_size"]), int(manifest["dim"])
    num_chunks = math.ceil(len(corpus) / chunk_size)
    files = []
    for i in range(num_chunks):
        found = sorted((out / CHUNK_DIR).glob(f"{i:06d}-*.npy"))
        if len(found) != 1:
            why = "is missing" if not found else f"has {len(found)} files"
            raise InputError(
                f"chunk {i} of {num_chunks} {why} (rows {i * chunk_size}..{min((i + 1) * chunk_size, len(corpus)) - 1})",
                file=str(out / CHUNK_DIR),
            )
        kept = _kept(corpus, i * chunk_size, (i + 1) * chunk_size, bool(manifest.get("skip_empty")))
        rows = min(chunk_size, len(corpus) - i * chunk_size) if kept is None else len(kept)
        if read_npy_shape(found[0]) != (rows, dim):
            raise InputError(f"expected {rows} vectors of {dim} dimensions", file=str(found[0]))
        files.append({"file": found[0].relative_to(out).as_posix(), "rows": rows})
    return _finish(out, manifest, files, corpus)


def _finish(out: Path, manifest: dict, files: list[dict], corpus: Corpus) -> Path:
    empty = corpus.empty_rows() if manifest.get("skip_empty") else np.zeros(0, np.int64)
    ids_are_rows = corpus.ids_are_rows and not len(empty)
    if not ids_are_rows:
        skipped = set(empty.tolist())
        write_json(out / "ids.json", [d for r, d in enumerate(corpus.ids) if r not in skipped])
    else:
        (out / "ids.json").unlink(missing_ok=True)
    final = {**manifest, "chunks": files, "corpus": corpus.fingerprint()}
    if manifest.get("skip_empty"):
        final["skipped_empty"] = len(empty)
    final.update(ids_are_rows=ids_are_rows, corpus_sources=_corpus_sources(corpus), complete=True)
    write_json(out / "manifest.json", final)
    shutil.rmtree(_replaced(out), ignore_errors=True)
    return out


# Importing released embeddings ---------------------------------------------------------------------


def embedding_shards(folder: str | Path) -> list[Path]:
    """`NAME-shard-N.pt` files of a folder in shard order; the numbers must run 0..S-1."""
    folder = Path(folder)
    found = {}
    for p in folder.glob("*-shard-*.pt"):
        m = _SHARD_FILE.match(p.name)
        if m:
            found.setdefault(int(m["index"]), []).append(p)
    if not found:
        raise InputError("no embedding shards (files named NAME-shard-N.pt)", file=str(folder))
    for i in range(max(found) + 1):
        if i not in found:
            raise InputError(f"embedding shard {i} of 0..{max(found)} is missing", file=str(folder))
        if len(found[i]) > 1:
            raise InputError(
                f"several files for shard {i}: {sorted(p.name for p in found[i])}", file=str(folder)
            )
    return [found[i][0] for i in range(len(found))]


def _load_shard(path: Path, dim: int):
    import torch

    try:
        tensor = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except Exception as e:  # a truncated or foreign file
        raise InputError(f"cannot load as a torch tensor ({type(e).__name__}: {e})", file=str(path)) from None
    if not isinstance(tensor, torch.Tensor) or tensor.ndim != 2 or not tensor.is_floating_point():
        what = (
            type(tensor).__name__
            if not isinstance(tensor, torch.Tensor)
            else f"{tensor.dtype} {tuple(tensor.shape)}"
        )
        raise InputError(f"expected a 2-D float tensor [rows, dim], found {what}", file=str(path))
    if tensor.shape[1] != dim:
        raise InputError(
            f"vectors have {tensor.shape[1]} dimensions, the encoder gives {dim}", file=str(path)
        )
    return tensor


def import_embeddings(
    corpus: Corpus,
    out: str | Path,
    embeddings: str | Path,
    encoder: Encoder,
    dtype: str = "float16",
    overwrite: bool = False,
    block_rows: int = 65_536,
) -> Path:
    """Import released embeddings (`NAME-shard-N.pt`) as this index's chunks without re-encoding.

    Every shard is checked before anything is written: a 2-D float tensor of the encoder's dimension,
    the rows of all shards adding up to the corpus size. Each shard becomes one chunk, written
    atomically, so an interrupted import resumes with the shards still missing.
    """
    import torch

    out = Path(out)
    shards = embedding_shards(embeddings)
    rows = [_shard_rows(p, encoder.dim) for p in shards]
    if sum(rows) != len(corpus):
        raise InputError(
            f"the {len(shards)} shards hold {sum(rows)} vectors, the corpus has {len(corpus)} passages",
            file=str(embeddings),
        )
    source = {
        "source": "import",
        "embeddings": [{"file": p.name, "rows": n} for p, n in zip(shards, rows, strict=True)],
    }
    chunks = _start(out, _settings(encoder, corpus, dtype, source), overwrite)
    store = torch.float16 if dtype == "float16" else torch.float32
    header = {"descr": np.dtype(np.float16 if dtype == "float16" else np.float32).str, "fortran_order": False}
    files = []
    for i, (path, n) in enumerate(
        tqdm(list(zip(shards, rows, strict=True)), desc="importing", unit="shard", disable=None)
    ):
        target = chunks / f"{i:06d}-{path.stem}.npy"
        if not (target.exists() and read_npy_shape(target) == (n, encoder.dim)):
            tensor = _load_shard(path, encoder.dim)  # mapped, read block by block, unmapped after
            with atomic_write(target, "wb") as f:
                np.lib.format.write_array_header_2_0(f, {**header, "shape": (n, encoder.dim)})
                for a in range(0, n, block_rows):
                    f.write(tensor[a : a + block_rows].to(store).numpy().tobytes())
            del tensor
        files.append({"file": target.relative_to(out).as_posix(), "rows": n})
    return _finish(out, json.loads((out / "manifest.json").read_text()), files, corpus)


def _shard_rows(path: Path, dim: int) -> int:
    """The row count of a shard, checked (the tensor is mapped, not read, and released at once)."""
    return int(_load_shard(path, dim).shape[0])


# Importing a released faiss index ------------------------------------------------------------------

# The flat kinds read exactly, by the file's four-character code (faiss/impl/index_write.cpp writes an
# IndexFlat as its code, its header and then its vectors, fp32, row after row, at the end of the file).
FAISS_FLAT_KINDS = {"IndexFlatIP": "ip", "IndexFlatL2": "l2", "IndexFlat": None}
FAISS_METRICS = {0: "ip", 1: "l2"}  # faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2
FAISS_QUERY_MAX_LENGTH = 256  # the release's retrieval server (`retrieval_query_max_length`)


@dataclass(frozen=True)
class EncoderSettings:
    """What an index records of its query encoder, for an index imported without loading the model."""

    name: str
    query_prefix: str
    passage_prefix: str
    query_max_length: int | None
    dim: int = 0  # 0: the dimension of the vectors imported


@dataclass(frozen=True)
class FaissFlat:
    """A flat faiss index file as read: its kind, metric, shape, and where its fp32 rows start."""

    path: Path
    kind: str
    metric: str
    rows: int
    dim: int
    offset: int


def read_faiss_flat(path: str | Path) -> FaissFlat:
    """The header of a flat faiss index (IndexFlatIP or IndexFlatL2), checked; anything else (not a faiss
    index, an IVF, PQ, HNSW or ID-mapped one) is an InputError in one line. faiss maps the file
    (IO_FLAG_MMAP_IFC) to read its kind, so nothing is loaded; the rows are read later by offset, and a
    few of them are compared with what faiss reconstructs, so a layout faiss changed is refused."""
    import faiss

    path = Path(path)
    if not path.is_file():
        raise InputError("no such file", file=str(path))
    try:
        read = faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC)
        index = faiss.downcast_index(read)  # a view of `read`, which must stay alive while it is used
    except RuntimeError as e:
        why = str(e).strip().splitlines()[-1].split(": ")[-1]
        raise InputError(f"not a faiss index ({why})", file=str(path)) from None
    kind = type(index).__name__
    metric = FAISS_METRICS.get(int(index.metric_type)) if kind in FAISS_FLAT_KINDS else None
    if metric is None:
        what = (
            f"a {kind}"
            if kind not in FAISS_FLAT_KINDS
            else f"a flat index of faiss metric {index.metric_type}"
        )
        raise InputError(
            f"{what}: only a flat index (IndexFlatIP or IndexFlatL2, as the released e5_Flat.index) holds the "
            "vectors themselves; an approximate one cannot be read as an exact index",
            file=str(path),
        )
    rows, dim = int(index.ntotal), int(index.d)
    offset = path.stat().st_size - rows * dim * 4
    with open(path, "rb") as f:
        f.seek(max(offset - 8, 0))
        count = int.from_bytes(f.read(8), "little")
    flat = FaissFlat(path, kind, metric, rows, dim, offset)
    probe = sorted({0, rows // 2, rows - 1}) if rows else []
    if (
        offset < 8
        or count != rows * dim
        or any(not np.array_equal(faiss_rows(flat, r, r + 1)[0], index.reconstruct(r)) for r in probe)
    ):
        raise InputError(f"a {kind} whose vectors are not where faiss writes them", file=str(path))
    return flat


def faiss_rows(flat: FaissFlat, start: int, stop: int) -> np.ndarray:
    """Rows start..stop-1 of a flat index file, fp32, read with `pread` (nothing else is read)."""
    out = np.empty((stop - start, flat.dim), np.float32)
    with open(flat.path, "rb") as f:
        got = os.preadv(f.fileno(), [memoryview(out).cast("B")], flat.offset + start * flat.dim * 4)
    if got != out.nbytes:
        raise InputError("file is shorter than its header says", file=str(flat.path))
    return out


def l2_rows(vectors: np.ndarray, scale: float, dtype: np.dtype) -> np.ndarray:
    """Rows of an L2 index as an inner-product index stores them: `[x, hi, lo]`, where hi + lo is
    |x|^2 / scale split over two stored numbers (fp16 alone would round it), so that the query
    `[2q, -scale, -scale]` scores 2 q.x - |x|^2 = |q|^2 - |q - x|^2 (see dense.L2Index)."""
    norms = np.einsum("ij,ij->i", vectors, vectors, dtype=np.float64) / scale
    hi = norms.astype(dtype)
    lo = (norms - hi.astype(np.float64)).astype(dtype)
    return np.concatenate([vectors.astype(dtype), hi[:, None], lo[:, None]], axis=1)


def l2_scale(flat: FaissFlat, block_rows: int) -> float:
    """A power of two that keeps every |x|^2 / scale within fp16's range (one pass over the rows)."""
    largest = 0.0
    for a in range(0, flat.rows, block_rows):
        block = faiss_rows(flat, a, min(a + block_rows, flat.rows))
        largest = max(largest, float(np.einsum("ij,ij->i", block, block).max(initial=0.0)))
    return float(2.0 ** max(0, math.ceil(math.log2(max(largest, 1.0) / 16384))))


def import_faiss(
    corpus: Corpus,
    out: str | Path,
    faiss_file: str | Path,
    encoder: EncoderSettings,
    dtype: str = "float16",
    overwrite: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_rows: int = 16_384,
) -> Path:
    """A released flat faiss index (Search-R1's and FlashRAG's `e5_Flat.index`) as this project's exact
    index, without re-encoding: its rows, in order, become chunks of `chunk_size` rows in `dtype`,
    read and written `block_rows` at a time (memory holds one block, never the index). Everything is
    checked before anything is written: the file is a flat index (inner product or L2) of as many
    vectors as the corpus has passages. Each chunk is written atomically, so an interrupted import
    resumes with the chunks still missing. An L2 index is stored as an inner-product one over rows with
    their squared norm appended (`l2_rows`, two more columns), searched as `dense.L2Index`."""
    out = Path(out)
    flat = read_faiss_flat(faiss_file)
    if flat.rows != len(corpus):
        raise InputError(
            f"the index holds {flat.rows} vectors, the corpus has {len(corpus)} passages",
            file=str(faiss_file),
        )
    if encoder.dim and flat.dim != encoder.dim:
        raise InputError(
            f"vectors have {flat.dim} dimensions, the encoder gives {encoder.dim}", file=str(faiss_file)
        )
    encoder = replace(encoder, dim=flat.dim)
    store = np.dtype(np.float16 if dtype == "float16" else np.float32)
    scale = l2_scale(flat, block_rows) if flat.metric == "l2" else 1.0
    faiss_source = {"file": flat.path.name, "kind": flat.kind, "bytes": flat.path.stat().st_size}
    source = {"source": "faiss", "faiss": faiss_source, "metric": flat.metric, "chunk_size": chunk_size}
    if flat.metric == "l2":
        source["l2_scale"] = scale
    chunks = _start(out, _settings(encoder, corpus, dtype, source), overwrite)
    width = flat.dim + (2 if flat.metric == "l2" else 0)
    files = []
    for i, start in enumerate(
        tqdm(range(0, flat.rows, chunk_size), desc="importing", unit="chunk", disable=None)
    ):
        n = min(chunk_size, flat.rows - start)
        target = chunks / f"{i:06d}-faiss.npy"
        if not (target.exists() and read_npy_shape(target) == (n, width)):
            header = {"descr": store.str, "fortran_order": False, "shape": (n, width)}
            with atomic_write(target, "wb") as f:
                np.lib.format.write_array_header_2_0(f, header)
                for a in range(start, start + n, block_rows):
                    block = faiss_rows(flat, a, min(a + block_rows, start + n))
                    rows = l2_rows(block, scale, store) if flat.metric == "l2" else block.astype(store)
                    if not np.isfinite(rows).all():
                        raise InputError(
                            f"rows {a}..{a + len(block) - 1} do not fit {dtype}: import with --dtype float32",
                            file=str(faiss_file),
                        )
                    f.write(rows.tobytes())
        files.append({"file": target.relative_to(out).as_posix(), "rows": n})
    return _finish(out, json.loads((out / "manifest.json").read_text()), files, corpus)


# Approximate indexes -------------------------------------------------------------------------------

APPROX_KINDS = ("ivf-flat", "ivf-pq", "hnsw")


def approx_factory(kind: str, n: int, nlist: int | None, pq_m: int, hnsw_m: int) -> str:
    """faiss `index_factory` string of an approximate kind; nlist defaults to about 4 x sqrt(n)."""
    lists = nlist or max(1, 2 ** round(math.log2(max(1.0, 4 * math.sqrt(n)))))
    factories = {
        "ivf-flat": f"IVF{lists},Flat",
        "ivf-pq": f"IVF{lists},PQ{pq_m}",
        "hnsw": f"HNSW{hnsw_m},Flat",
    }
    return factories[kind]


def approx_recall(
    exact: ExactIndex, approx, queries: np.ndarray, k: int, self_rows: np.ndarray | None = None
) -> float:
    """Mean share of exact search's top-k that the approximate index also returns in its top-k. Queries
    that are corpus vectors (`self_rows`) leave their own row out of both lists."""
    extra = 1 if self_rows is not None else 0
    _, truth = exact.search(queries, k + extra)
    _, got = approx.search(queries, k + extra)
    shares = []
    for i in range(len(queries)):
        t, g = truth[i].tolist(), got[i].tolist()
        if self_rows is not None:
            t = [r for r in t if r != self_rows[i]][:k]
            g = [r for r in g if r != self_rows[i]][:k]
        t, g = t[:k], g[:k]
        shares.append(len(set(t) & set(g)) / max(1, len(t)))
    return float(np.mean(shares))


def build_approx(
    out: str | Path,
    kind: str = "ivf-pq",
    *,
    factory: str | None = None,
    nlist: int | None = None,
    pq_m: int = 64,
    hnsw_m: int = 32,
    nprobe: int = 32,
    ef_search: int = 128,
    rerank: int = 100,
    train_size: int = 200_000,
    recall_queries: np.ndarray | None = None,
    k: int = 20,
    seed: int = 0,
) -> dict:
    """Train and fill an approximate faiss index from a finished dense index's chunks, save it as
    `approx/KIND.faiss` (settings and measured recall@k against exact search beside it) and return
    that report. Without `recall_queries`, 200 corpus vectors serve as queries."""
    import faiss

    from corag.retrieval.base import read_manifest
    from corag.retrieval.dense import ApproxIndex, apply_search_settings

    out = Path(out)
    manifest = read_manifest(out, "dense")
    if manifest.get("metric") == "l2":
        raise InputError("an index imported from an L2 faiss index is searched exactly only", file=str(out))
    exact = ExactIndex(index_chunks(out, manifest))
    n, dim = exact.ntotal, int(manifest["dim"])
    factory = factory or approx_factory(kind, n, nlist, pq_m, hnsw_m)
    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise InputError(f"faiss cannot build {factory!r}: {e}", field="factory") from None
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and hasattr(faiss.downcast_index(ivf), "do_polysemous_training"):
        faiss.downcast_index(ivf).do_polysemous_training = False  # only polysemous search needs it (slow)
    rng = np.random.default_rng(seed)
    if not index.is_trained:
        sample = np.sort(rng.choice(n, min(n, train_size), replace=False))
        index.train(exact.vectors(sample))
    for chunk in tqdm(exact.chunks, desc=f"adding to {factory}", unit="chunk", disable=None):
        for start in range(0, len(chunk), 65_536):
            index.add(np.asarray(chunk[start : start + 65_536], dtype=np.float32))
    apply_search_settings(index, nprobe, ef_search)
    folder = out / "approx"
    folder.mkdir(exist_ok=True)
    path = folder / f"{kind}.faiss"
    with atomic_write(path, "wb") as f:
        f.write(faiss.serialize_index(index).tobytes())
    self_rows = None
    if recall_queries is None:
        self_rows = np.sort(rng.choice(n, min(n, 200), replace=False))
        recall_queries = exact.vectors(self_rows)
    approx = ApproxIndex(index, exact, rerank)
    report = {
        "kind": kind,
        "factory": factory,
        "nprobe": nprobe,
        "ef_search": ef_search,
        "rerank": rerank,
        f"recall@{k}": approx_recall(exact, approx, recall_queries, k, self_rows),
        f"recall@{k}_without_rerank": approx_recall(exact, ApproxIndex(index), recall_queries, k, self_rows),
        "recall_queries": "corpus vectors" if self_rows is not None else "given queries",
        "bytes": path.stat().st_size,
        "exact_bytes": sum((out / c["file"]).stat().st_size for c in manifest["chunks"]),
    }
    write_json(path.with_suffix(".json"), report)
    return report


# BM25 ----------------------------------------------------------------------------------------------


def build_bm25(corpus: Corpus, out: str | Path, overwrite: bool = False, skip_empty: bool = False) -> Path:
    """Build and save a BM25 index over `title + contents` of every passage (with `skip_empty`, of every
    passage that has some), memory-bounded."""
    from corag.retrieval.bm25 import build_bm25_folder

    out = Path(out)
    if (out / "manifest.json").exists() and not overwrite:
        raise InputError("folder already holds an index; use --overwrite", file=str(out))
    batches = tqdm(corpus.iter_batches(8192), total=-(-len(corpus) // 8192), desc="tokenizing", unit="batch")
    if skip_empty:
        batches = ([p for p in batch if p.title or p.contents] for batch in batches)
    return build_bm25_folder(batches, out, num_docs=len(corpus), corpus=corpus.fingerprint())
