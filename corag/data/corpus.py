"""The retrieval corpus: passages in a memory-mapped Arrow file, looked up by string id.

A JSONL or parquet source is converted once into an uncompressed Arrow IPC file (beside the source,
or in a cache folder) and then opened with a memory map, so a 35M-passage corpus costs no RAM until
rows are read and no Python object exists per passage. Ids are strings. A corpus without an `id`
column (like the KILT corpus) uses the row number as id; ids that equal their row numbers are looked
up by arithmetic too. Any other ids get a sorted index (ids in byte order plus their rows, kept in a
second memory-mapped Arrow file) searched by bisection: about 16 bytes plus the id per passage, and
log2(n) comparisons per lookup.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from corag.data.jsonl import atomic_write, dumps, iter_jsonl
from corag.errors import InputError
from corag.types import Example, Passage

_FORMAT_VERSION = "1"
_BATCH_ROWS = 16_384


# Building the Arrow file ---------------------------------------------------------------------------


def _cache_path(source: Path, cache_dir: str | Path | None, suffix: str = ".arrow") -> Path:
    """Where the Arrow copy of `source` lives: beside it when that folder is writable (or always in
    `cache_dir` when given, or `$CORAG_CACHE_DIR`/~/.cache/corag/corpus as a fallback)."""
    if cache_dir is None and os.access(source.parent, os.W_OK):
        return source.with_name(source.name + suffix)
    folder = Path(
        cache_dir or os.environ.get("CORAG_CACHE_DIR") or Path.home() / ".cache" / "corag" / "corpus"
    )
    digest = hashlib.sha1(str(source.resolve()).encode()).hexdigest()[:12]
    return folder / f"{source.name}.{digest}{suffix}"


def _source_stamp(source: Path) -> dict[bytes, bytes]:
    st = source.stat()
    return {
        b"corag_version": _FORMAT_VERSION.encode(),
        b"corag_source": str(source.resolve()).encode(),
        b"corag_size": str(st.st_size).encode(),
        b"corag_mtime_ns": str(st.st_mtime_ns).encode(),
    }


def _is_fresh(cache: Path, stamp: dict[bytes, bytes]) -> bool:
    if not cache.exists():
        return False
    try:
        with pa.memory_map(str(cache), "r") as source:
            metadata = pa.ipc.open_file(source).schema.metadata or {}
    except (pa.ArrowInvalid, OSError):
        return False
    return all(metadata.get(k) == v for k, v in stamp.items())


def _schema(has_id: bool, metadata: dict[bytes, bytes]) -> pa.Schema:
    names = ["id", "title", "contents"] if has_id else ["title", "contents"]
    return pa.schema([pa.field(n, pa.string()) for n in names], metadata=metadata)


def _write_batches(cache: Path, schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> None:
    """Stream record batches into an uncompressed Arrow IPC file, atomically."""
    with atomic_write(cache, "wb") as f, pa.ipc.new_file(f, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)


def _jsonl_batches(path: Path, has_id: bool) -> Iterator[pa.RecordBatch]:
    """Validated record batches of a corpus JSONL (`id`, `title`, `contents` per line)."""
    cols: dict[str, list[str]] = {"id": [], "title": [], "contents": []}
    names = ("id", "title", "contents") if has_id else ("title", "contents")
    for line_no, r in tqdm(iter_jsonl(path), desc=f"indexing {path.name}", unit=" passages", disable=None):
        if isinstance(r.get("id"), int) and not isinstance(r.get("id"), bool):
            r["id"] = str(r["id"])
        if ("id" in r) != has_id:
            why = "missing (other lines have ids)" if has_id else "present (the first line has none)"
            raise InputError(f"id {why}", file=str(path), line=line_no, field="id")
        for name in names:
            if not isinstance(r.get(name), str):
                got = "missing" if name not in r else f"not a string ({type(r[name]).__name__})"
                raise InputError(f"field {got}", file=str(path), line=line_no, record=r.get("id"), field=name)
            cols[name].append(r[name])
        if len(cols["title"]) >= _BATCH_ROWS:
            yield pa.record_batch([pa.array(cols[n], pa.string()) for n in names], names=list(names))
            cols = {n: [] for n in cols}
    if cols["title"]:
        yield pa.record_batch([pa.array(cols[n], pa.string()) for n in names], names=list(names))


def _first_jsonl_has_id(path: Path) -> bool:
    for _, r in iter_jsonl(path):
        return "id" in r
    return False


def _normalise_table_columns(batch: pa.RecordBatch | pa.Table, file: str) -> tuple[list[pa.Array], list[str]]:
    """Check and cast the columns of a parquet batch or dataset table to (id,) title, contents."""
    names = batch.schema.names
    for required in ("title", "contents"):
        if required not in names:
            raise InputError(f"no {required!r} column (columns: {names})", file=file, field=required)
    keep = (["id"] if "id" in names else []) + ["title", "contents"]
    arrays = []
    for name in keep:
        column = batch.column(name)
        if column.null_count:
            row = pc.index(pc.is_null(column), True).as_py()
            raise InputError(f"null value in row {row}", file=file, field=name)
        try:
            arrays.append(pc.cast(column, pa.string()))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise InputError(
                f"cannot read column of type {column.type} as strings", file=file, field=name
            ) from None
    return arrays, keep


def _parquet_batches(path: Path) -> Iterator[pa.RecordBatch]:
    parquet = pq.ParquetFile(path)
    bar = tqdm(total=parquet.metadata.num_rows, desc=f"indexing {path.name}", unit=" passages", disable=None)
    for batch in parquet.iter_batches(batch_size=_BATCH_ROWS):
        arrays, names = _normalise_table_columns(batch, str(path))
        bar.update(batch.num_rows)
        yield pa.record_batch(arrays, names=names)
    bar.close()


def _open_mapped(path: Path) -> pa.Table:
    """Open an Arrow IPC file zero-copy: the table's buffers point into the memory map."""
    return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()


# The id index --------------------------------------------------------------------------------------


def _ids_are_rows(ids: pa.ChunkedArray) -> bool:
    rows = pc.cast(pa.array(np.arange(len(ids), dtype=np.int64)), pa.string())
    return len(ids) == 0 or bool(pc.all(pc.equal(ids, rows)).as_py())


def _build_index(ids: pa.ChunkedArray, file: str) -> pa.Table:
    """Ids sorted in byte order (one contiguous large_string array) with their row numbers."""
    order = pc.sort_indices(ids)
    sorted_ids = pc.cast(pc.take(ids, order), pa.large_string()).combine_chunks()
    if len(sorted_ids) > 1:
        same = pc.equal(sorted_ids.slice(1), sorted_ids.slice(0, len(sorted_ids) - 1))
        if pc.any(same).as_py():
            k = pc.index(same, True).as_py()
            dup = sorted_ids[k].as_py()
            rows = sorted((order[k].as_py(), order[k + 1].as_py()))
            raise InputError(
                f"duplicate passage id (rows {rows[0]} and {rows[1]})", file=file, record=dup, field="id"
            )
    return pa.table({"id": sorted_ids, "row": pc.cast(order, pa.int64())})


def _single_chunk(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array, without copying when it already is one chunk (memory-mapped)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


class _SortedIndex:
    """Bisection over ids sorted in byte order, reading the id bytes straight from Arrow buffers."""

    def __init__(self, table: pa.Table) -> None:
        ids, rows = _single_chunk(table.column("id")), _single_chunk(table.column("row"))
        self._rows = rows.to_numpy()
        self._n = len(ids)
        buffers = ids.buffers()
        self._offsets = np.frombuffer(buffers[1], dtype=np.int64)[ids.offset : ids.offset + self._n + 1]
        self._data = memoryview(buffers[2]) if buffers[2] is not None else memoryview(b"")

    def _key(self, i: int) -> bytes:
        return bytes(self._data[self._offsets[i] : self._offsets[i + 1]])

    def row(self, doc_id: str) -> int | None:
        target = doc_id.encode()
        lo, hi = 0, self._n
        while lo < hi:
            mid = (lo + hi) // 2
            if self._key(mid) < target:
                lo = mid + 1
            else:
                hi = mid
        return int(self._rows[lo]) if lo < self._n and self._key(lo) == target else None


# The corpus ----------------------------------------------------------------------------------------


class _Ids(Sequence[str]):
    """The corpus ids in row order, read lazily (no list of n strings is ever built)."""

    def __init__(self, column: pa.ChunkedArray | None, n: int) -> None:
        self._column, self._n = column, n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return str(i) if self._column is None else self._column[i].as_py()

    def __iter__(self) -> Iterator[str]:
        if self._column is None:
            yield from map(str, range(self._n))
            return
        for start in range(0, self._n, _BATCH_ROWS):
            yield from self._column.slice(start, _BATCH_ROWS).to_pylist()


class Corpus:
    """Passages (`id`, `title`, `contents`) in an Arrow table, normally memory-mapped from disk."""

    def __init__(self, table: pa.Table, *, name: str = "<corpus>", index: pa.Table | None = None) -> None:
        """Wrap a table with `title`, `contents` and optionally `id` string columns. Building the id
        index (when ids are not row numbers) checks for duplicates; pass a prebuilt `index` to skip it."""
        self.name = name
        self._table = table
        self._has_id = "id" in table.schema.names
        self._index: _SortedIndex | None = None
        if self._has_id and index is None and not _ids_are_rows(table.column("id")):
            index = _build_index(table.column("id"), name)
        if index is not None:
            self._index = _SortedIndex(index)

    # Constructors

    @classmethod
    def from_jsonl(cls, path: str | Path, *, cache_dir: str | Path | None = None) -> Corpus:
        """A corpus JSONL (`{"id", "title", "contents"}` per line; `id` may be absent on every line)."""
        path = Path(path)
        cache, stamp = _cache_path(path, cache_dir), _source_stamp(path)
        if not _is_fresh(cache, stamp):
            has_id = _first_jsonl_has_id(path)
            _write_batches(cache, _schema(has_id, stamp), _jsonl_batches(path, has_id))
        return cls.open(cache, name=str(path))

    @classmethod
    def from_parquet(cls, path: str | Path, *, cache_dir: str | Path | None = None) -> Corpus:
        """A parquet corpus (`title`, `contents`, optional `id`), copied once to an uncompressed Arrow
        file since parquet pages cannot be memory-mapped as they are."""
        path = Path(path)
        cache, stamp = _cache_path(path, cache_dir), _source_stamp(path)
        if not _is_fresh(cache, stamp):
            has_id = "id" in pq.ParquetFile(path).schema_arrow.names
            _write_batches(cache, _schema(has_id, stamp), _parquet_batches(path))
        return cls.open(cache, name=str(path))

    @classmethod
    def from_dataset(cls, dataset: Any) -> Corpus:
        """A `datasets.Dataset` with `title`, `contents` (and optional `id`) columns. Its Arrow data is
        used as is: memory-mapped when the dataset was loaded from disk."""
        table = dataset.with_format("arrow")[:]
        arrays, names = _normalise_table_columns(table, "<dataset>")
        return cls(pa.table(arrays, names=names), name="<dataset>")

    @classmethod
    def open(cls, path: str | Path, *, name: str | None = None) -> Corpus:
        """An Arrow file written by this module (or any uncompressed Arrow IPC file with the same
        columns), memory-mapped. The id index is kept beside it, built on first open."""
        path = Path(path)
        table = _open_mapped(path)
        _normalise_table_columns(table.slice(0, 0), str(path))
        index = None
        if "id" in table.schema.names and not _ids_are_rows(table.column("id")):
            index_path = path.with_name(path.name + ".index")
            stamp = {b"corag_index_of": str(path.stat().st_mtime_ns).encode()}
            if _is_fresh(index_path, stamp):
                index = _open_mapped(index_path)
            else:
                index = _build_index(table.column("id"), name or str(path))
                if os.access(path.parent, os.W_OK):  # else keep the index in memory for this run
                    _write_batches(index_path, index.schema.with_metadata(stamp), index.to_batches())
                    index = _open_mapped(index_path)
        return cls(table, name=name or str(path), index=index)

    @classmethod
    def load(cls, path: str | Path, *, cache_dir: str | Path | None = None) -> Corpus:
        """By suffix: .jsonl, .parquet, .arrow/.feather; a folder saved with `Dataset.save_to_disk`."""
        path = Path(path)
        if path.is_dir():
            import datasets

            return cls.from_dataset(datasets.load_from_disk(str(path)))
        if not path.is_file():
            raise InputError("no such corpus file", file=str(path))
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            return cls.from_jsonl(path, cache_dir=cache_dir)
        if suffix == ".parquet":
            return cls.from_parquet(path, cache_dir=cache_dir)
        if suffix in (".arrow", ".feather"):
            return cls.open(path)
        raise InputError(
            "unknown corpus suffix (expected .jsonl, .parquet, .arrow or .feather)", file=str(path)
        )

    # Access

    def __len__(self) -> int:
        return self._table.num_rows

    @property
    def ids(self) -> Sequence[str]:
        """All ids in row order."""
        return _Ids(self._table.column("id") if self._has_id else None, len(self))

    @property
    def table(self) -> pa.Table:
        """The underlying Arrow table (for bulk work such as encoding the whole corpus)."""
        return self._table

    def row(self, doc_id: str) -> int:
        """The row of `doc_id`; InputError naming the id when the corpus has no such passage."""
        row: int | None = None
        if self._index is not None:
            row = self._index.row(doc_id)
        elif doc_id.isdigit() and (doc_id == "0" or not doc_id.startswith("0")):
            row = int(doc_id)
        if row is None or row >= len(self):
            raise InputError("unknown document id", file=self.name, record=doc_id, field="id")
        return row

    def get(self, doc_id: str) -> Passage:
        """The passage with id `doc_id`."""
        return self.get_many([doc_id])[0]

    def get_many(self, doc_ids: Sequence[str]) -> list[Passage]:
        """Passages for many ids at once (one Arrow `take`), in the order asked."""
        rows = [self.row(d) for d in doc_ids]
        return self._passages(self._table.take(pa.array(rows, pa.int64())), rows)

    def iter_batches(self, batch_size: int = 1024) -> Iterator[list[Passage]]:
        """All passages in row order, `batch_size` at a time."""
        for start in range(0, len(self), batch_size):
            chunk = self._table.slice(start, batch_size)
            yield self._passages(chunk, range(start, start + chunk.num_rows))

    def _passages(self, chunk: pa.Table, rows: Iterable[int]) -> list[Passage]:
        ids = chunk.column("id").to_pylist() if self._has_id else [str(r) for r in rows]
        titles, contents = chunk.column("title").to_pylist(), chunk.column("contents").to_pylist()
        return [Passage(i, t, c) for i, t, c in zip(ids, titles, contents, strict=True)]


def write_corpus_jsonl(path: str | Path, passages: Iterable[Passage]) -> int:
    """Write passages as corpus JSONL lines, atomically; returns the count."""
    n = 0
    with atomic_write(path) as f:
        for p in passages:
            f.write(dumps({"id": p.id, "title": p.title, "contents": p.contents}) + "\n")
            n += 1
    return n


# A corpus from the datasets' own context paragraphs ------------------------------------------------


@dataclass(frozen=True)
class ContextCorpus:
    """What `corpus_from_contexts` made: the corpus file, the examples with their supporting ids
    filled, and the maps from (title, text) and from title to corpus ids."""

    path: Path
    examples: list[Example]
    ids: dict[tuple[str, str], str]
    title_ids: dict[str, list[str]]

    def resolve_titles(self, titles: Iterable[str]) -> tuple[str, ...]:
        """Every corpus id whose passage has one of these titles (a title can name several passages)."""
        return tuple(i for t in titles for i in self.title_ids.get(t, []))


def _with_context_ids(example: Example, ids: dict[tuple[str, str], str]) -> Example:
    """Fill supporting_ids (in supporting_titles order) and MuSiQue's per-step doc_ids."""
    paragraphs = example.meta["paragraphs"]
    pid = [ids[(p["title"], p["text"])] for p in paragraphs]
    by_title: dict[str, list[str]] = {}
    for p, i in zip(paragraphs, pid, strict=True):
        if p["is_supporting"]:
            by_title.setdefault(p["title"], []).append(i)
    supporting = [i for t in example.supporting_titles for i in by_title.pop(t, [])]
    supporting += [i for rest in by_title.values() for i in rest]
    steps = example.decomposition
    raw = example.meta.get("question_decomposition") or []
    if raw and len(raw) == len(steps):
        by_idx = {p.get("idx", j): i for j, (p, i) in enumerate(zip(paragraphs, pid, strict=True))}
        steps = tuple(
            replace(s, doc_ids=(by_idx[d["paragraph_support_idx"]],))
            if d.get("paragraph_support_idx") in by_idx
            else s
            for s, d in zip(steps, raw, strict=True)
        )
    return replace(example, supporting_ids=tuple(dict.fromkeys(supporting)), decomposition=steps)


def corpus_from_contexts(sources: Iterable[Example | str | Path], out: str | Path) -> ContextCorpus:
    """Build a retrieval corpus from the context paragraphs of HotpotQA, 2WikiMultihopQA and MuSiQue
    questions (examples, or files that `load_examples` reads), de-duplicated by (title, text) as IRCoT
    did. Ids are row numbers in first-seen order. Writes corpus JSONL to `out` (atomically) and returns
    the examples with `supporting_ids` (and MuSiQue step `doc_ids`) pointing into it. Examples without
    context paragraphs pass through unchanged."""
    from corag.data.formats import load_examples

    examples: list[Example] = []
    for source in sources:
        examples.extend(load_examples(source) if isinstance(source, str | Path) else [source])
    ids: dict[tuple[str, str], str] = {}
    title_ids: dict[str, list[str]] = {}
    for example in examples:
        for p in example.meta.get("paragraphs") or []:
            key = (p["title"], p["text"])
            if key not in ids:
                ids[key] = str(len(ids))
                title_ids.setdefault(p["title"], []).append(ids[key])
    write_corpus_jsonl(out, (Passage(i, title, text) for (title, text), i in ids.items()))
    filled = [_with_context_ids(e, ids) if e.meta.get("paragraphs") else e for e in examples]
    return ContextCorpus(Path(out), filled, ids, title_ids)
