"""The retrieval corpus: passages in a prepared on-disk store, read by byte offsets.

A source (corpus JSONL, one parquet file, a folder of parquet files such as the hub layout
`data/train-000NN-of-000MM.parquet`, an Arrow file, or a folder saved with `Dataset.save_to_disk`)
is converted ONCE into a store folder (`corag corpus prepare`, or on first open; other processes
wait on a file lock and reuse it). The store keeps each column as one file of UTF-8 bytes plus a
file of int64 offsets, so a corpus of any size works and fetching k passages reads k byte ranges
with `pread`: no table is copied, nothing is memory-mapped into the reader, and the page cache is
shared by every process on the machine.

Store layout (`NAME.corag/`): `store.json` (rows, columns, sources it was built from),
`title.bin` + `title.offsets`, `contents.bin` + `contents.offsets`, and, only for ids that are not
the row numbers, `id.bin` + `id.offsets` + `id.order` (rows sorted by id bytes, for bisection).
A corpus without ids, like the KILT corpus, uses the row number as the id.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm.auto import tqdm

from corag.data.jsonl import (
    atomic_folder,
    atomic_write,
    check_output,
    dumps,
    iter_jsonl,
    locked,
    open_parquet,
    provisional,
    refuse_inputs_as_outputs,
)
from corag.errors import InputError
from corag.types import Example, Passage

STORE_FORMAT, STORE_VERSION = "corag-corpus", 2
STORE_SUFFIX = ".corag"
_BATCH_ROWS = 16_384
_HUB_SHARD = re.compile(r"^(?P<split>[\w.]+?)-(?P<index>\d{5})-of-(?P<count>\d{5})\.parquet$")


# One string column on disk -------------------------------------------------------------------------


class _ColumnWriter:
    """Appends strings to `NAME.bin` and their end offsets to `NAME.offsets` (int64, first is 0)."""

    def __init__(self, folder: Path, name: str) -> None:
        self.data = open(folder / f"{name}.bin", "wb")
        self.offsets = open(folder / f"{name}.offsets", "wb")
        self.offsets.write(np.zeros(1, "<i8").tobytes())
        self.size = 0

    def append(self, values: pa.Array | Sequence[str]) -> None:
        """Append an Arrow string array (no nulls; its buffers are written as they are) or strings."""
        if isinstance(values, pa.Array | pa.ChunkedArray):
            array = pc.cast(values, pa.large_string())
            for chunk in array.chunks if isinstance(array, pa.ChunkedArray) else [array]:
                ends = np.frombuffer(chunk.buffers()[1], "<i8")[chunk.offset : chunk.offset + len(chunk) + 1]
                data = chunk.buffers()[2]
                if data is not None and ends[-1] > ends[0]:
                    self.data.write(memoryview(data)[ends[0] : ends[-1]])
                self._ends(ends[1:] - ends[0])
            return
        encoded = [v.encode() for v in values]
        self.data.write(b"".join(encoded))
        self._ends(np.cumsum([len(b) for b in encoded], dtype="<i8"))

    def _ends(self, relative_ends: np.ndarray) -> None:
        if len(relative_ends):
            self.offsets.write((relative_ends + self.size).astype("<i8").tobytes())
            self.size += int(relative_ends[-1])

    def close(self) -> None:
        for f in (self.data, self.offsets):
            f.flush()
            os.fsync(f.fileno())
            f.close()


class _Column:
    """Reads strings of one stored column by row with `pread` (thread-safe, no shared position)."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder, self.name = folder, name
        self._data = os.open(folder / f"{name}.bin", os.O_RDONLY)
        self._offsets = os.open(folder / f"{name}.offsets", os.O_RDONLY)

    def get(self, row: int) -> str:
        start, end = np.frombuffer(os.pread(self._offsets, 16, 8 * row), "<i8")
        return os.pread(self._data, int(end - start), int(start)).decode()

    def range(self, start: int, stop: int) -> list[str]:
        """Rows start..stop-1 with two reads."""
        if stop <= start:
            return []
        ends = np.frombuffer(os.pread(self._offsets, 8 * (stop - start + 1), 8 * start), "<i8")
        base = int(ends[0])
        blob = os.pread(self._data, int(ends[-1]) - base, base)
        cuts = (ends - base).tolist()
        return [blob[a:b].decode() for a, b in zip(cuts[:-1], cuts[1:], strict=True)]

    def memmaps(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, bytes) memory-mapped, for bulk work such as sorting ids."""
        offsets = np.memmap(self.folder / f"{self.name}.offsets", "<i8", "r", shape=(rows + 1,))
        data_path = self.folder / f"{self.name}.bin"
        data = np.memmap(data_path, np.uint8, "r") if data_path.stat().st_size else np.zeros(0, np.uint8)
        return offsets, data

    def close(self) -> None:
        for fd in (self._data, self._offsets):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._data = self._offsets = -1

    def __del__(self) -> None:
        if getattr(self, "_offsets", -1) >= 0:
            self.close()


# Sources -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    """What a store is built from: its files (for staleness checks) and how to read them."""

    path: Path
    kind: str  # jsonl | parquet | arrow | dataset
    files: tuple[Path, ...]

    def stamps(self) -> list[dict[str, Any]]:
        return [
            {"path": str(f.resolve()), "size": f.stat().st_size, "mtime_ns": f.stat().st_mtime_ns}
            for f in self.files
        ]


def _hub_parquet_files(folder: Path) -> list[Path]:
    """The parquet files under `folder` in row order. Hub-style shards (`SPLIT-NNNNN-of-MMMMM`) must
    be complete; of several splits only `train` is used (a corpus has one)."""
    files = sorted(p for p in folder.rglob("*.parquet") if not p.name.startswith("."))
    if not files:
        raise InputError(
            "folder holds no parquet files, no store.json and no saved dataset", file=str(folder)
        )
    shards: dict[str, list[tuple[int, int, Path]]] = {}
    for f in files:
        m = _HUB_SHARD.match(f.name)
        if m:
            shards.setdefault(m["split"], []).append((int(m["index"]), int(m["count"]), f))
    if not shards:
        return files
    split = "train" if "train" in shards else next(iter(shards)) if len(shards) == 1 else None
    if split is None:
        raise InputError(
            f"parquet shards of several splits {sorted(shards)} and none is 'train'", file=str(folder)
        )
    parts = sorted(shards[split])
    counts = {count for _, count, _ in parts}
    expected = list(range(parts[0][1]))
    if len(counts) != 1 or [i for i, _, _ in parts] != expected:
        have = {i for i, _, _ in parts}
        missing = [i for i in expected if i not in have]
        why = (
            f"shard {missing[0]:05d} of {parts[0][1]:05d} is missing" if missing else "shard counts disagree"
        )
        raise InputError(f"incomplete parquet shards of split {split!r}: {why}", file=str(folder))
    return [f for _, _, f in parts]


def _find_source(path: Path) -> _Source:
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
            return _Source(path, "dataset", tuple(sorted(path.rglob("*.arrow"))))
        return _Source(path, "parquet", tuple(_hub_parquet_files(path)))
    if not path.is_file():
        raise InputError("no such corpus file or folder", file=str(path))
    suffix = path.suffix.lower()
    kinds = {".jsonl": "jsonl", ".parquet": "parquet", ".arrow": "arrow", ".feather": "arrow"}
    if suffix not in kinds:
        raise InputError(
            "unknown corpus suffix (expected .jsonl, .parquet, .arrow or .feather, or a folder)",
            file=str(path),
        )
    return _Source(path, kinds[suffix], (path,))


def _table_columns(batch: pa.RecordBatch | pa.Table, file: str, first_row: int) -> dict[str, pa.Array]:
    """The (id,) title and contents columns of a batch as strings, or an InputError naming the column."""
    names = batch.schema.names
    for required in ("title", "contents"):
        if required not in names:
            raise InputError(f"no {required!r} column (columns: {names})", file=file, field=required)
    columns = {}
    for name in (["id"] if "id" in names else []) + ["title", "contents"]:
        column = batch.column(name)
        if column.null_count:
            row = first_row + pc.index(pc.is_null(column), True).as_py()
            raise InputError(f"null value in row {row}", file=file, field=name)
        try:
            columns[name] = pc.cast(column, pa.large_string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise InputError(
                f"cannot read column of type {column.type} as strings", file=file, field=name
            ) from None
    return columns


def _arrow_batches(source: _Source) -> Iterator[tuple[str, pa.RecordBatch | pa.Table]]:
    """(file name, batch) of an Arrow-backed source, in row order."""
    if source.kind == "parquet":
        for f in source.files:
            for batch in open_parquet(f).iter_batches(batch_size=_BATCH_ROWS):
                yield str(f), batch
    elif source.kind == "arrow":
        with pa.memory_map(str(source.path), "r") as mm:
            try:
                reader: Any = pa.ipc.open_file(mm)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            except pa.ArrowInvalid:
                mm.seek(0)
                batches = iter(pa.ipc.open_stream(mm))
            for batch in batches:
                yield str(source.path), batch
    else:
        import datasets

        ds = datasets.load_from_disk(str(source.path))
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds and len(ds) != 1:
                raise InputError(
                    f"saved dataset has splits {sorted(ds)} and none is 'train'", file=str(source.path)
                )
            ds = ds["train"] if "train" in ds else next(iter(ds.values()))
        for table in ds.with_format("arrow").iter(batch_size=_BATCH_ROWS):
            yield str(source.path), table


def _source_rows(source: _Source) -> int | None:
    if source.kind == "parquet":
        return sum(open_parquet(f).metadata.num_rows for f in source.files)
    return None


def _split_contents(r: dict[str, Any], path: Path, line_no: int) -> None:
    """A FlashRAG / Search-R1 line (`{"id", "contents": "\"Title\"\ntext"}`, as wiki-18 is published)
    as title and text: the first line of `contents` is the title, kept as written (quotes included, as
    Search-R1 shows it), the rest the text; `title\ntext` is then the contents the release embedded."""
    contents = r.get("contents")
    if not isinstance(contents, str):
        got = "missing" if "contents" not in r else f"not a string ({type(contents).__name__})"
        raise InputError(f"field {got}", file=str(path), line=line_no, record=r.get("id"), field="contents")
    r["title"], _, r["contents"] = contents.partition("\n")


def _jsonl_batches(path: Path) -> Iterator[tuple[dict[str, list[str]], int]]:
    """(columns, bytes read) per batch of a corpus JSONL; every line checked, errors name the line. A
    file whose first line has no `title` is in FlashRAG's layout (wiki-18): `_split_contents`."""
    has_id: bool | None = None
    has_title: bool | None = None
    cols: dict[str, list[str]] = {"id": [], "title": [], "contents": []}
    read = [0]  # bytes read since the last batch

    def count(size: int) -> None:
        read[0] += size

    for line_no, r in iter_jsonl(path, count):
        if isinstance(r.get("id"), int) and not isinstance(r.get("id"), bool):
            r["id"] = str(r["id"])
        if has_id is None:
            has_id = "id" in r
        if ("id" in r) != has_id:
            why = "missing (other lines have ids)" if has_id else "present (the first line has none)"
            raise InputError(f"id {why}", file=str(path), line=line_no, field="id")
        if has_title is None:
            has_title = "title" in r
        if ("title" in r) != has_title:
            why = (
                "missing (other lines have titles)"
                if has_title
                else "present (the first line has none: its title is the first line of contents)"
            )
            raise InputError(f"title {why}", file=str(path), line=line_no, record=r.get("id"), field="title")
        if not has_title:
            _split_contents(r, path, line_no)
        names = ("id", "title", "contents") if has_id else ("title", "contents")
        for name in names:
            value = r.get(name)
            if not isinstance(value, str):
                got = "missing" if name not in r else f"not a string ({type(value).__name__})"
                raise InputError(f"field {got}", file=str(path), line=line_no, record=r.get("id"), field=name)
            cols[name].append(value)
        if len(cols["title"]) >= _BATCH_ROWS:
            yield {name: cols[name] for name in names}, read[0]
            cols, read[0] = {"id": [], "title": [], "contents": []}, 0
    if cols["title"]:
        yield {name: cols[name] for name in names}, read[0]


# Building a store ----------------------------------------------------------------------------------


def default_store_path(source: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Where the store of `source` lives: `SOURCE.corag` beside it when that folder is writable, else
    (or always when `cache_dir` is given) in `cache_dir`, `$CORAG_CACHE_DIR` or ~/.cache/corag/corpus."""
    source = Path(source)
    if cache_dir is None and os.access(source.resolve().parent, os.W_OK):
        return source.with_name(source.name + STORE_SUFFIX)
    folder = Path(
        cache_dir or os.environ.get("CORAG_CACHE_DIR") or Path.home() / ".cache" / "corag" / "corpus"
    )
    digest = hashlib.sha1(str(source.resolve()).encode()).hexdigest()[:12]
    return folder / f"{source.name}.{digest}{STORE_SUFFIX}"


def _read_manifest(store: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((store / "store.json").read_text())
    except (OSError, ValueError):
        return None
    ok = manifest.get("format") == STORE_FORMAT and manifest.get("version") == STORE_VERSION
    return manifest if ok and manifest.get("complete") else None


def _write_store(source: _Source, folder: Path) -> dict[str, Any]:
    """Convert `source` into a store in the (empty) `folder`; returns its manifest."""
    writers: dict[str, _ColumnWriter] = {}
    rows, ids_are_rows = 0, True
    total = _source_rows(source)
    unit_bytes = source.kind == "jsonl"
    bar = tqdm(
        total=source.path.stat().st_size if unit_bytes else total,
        unit="B" if unit_bytes else " passages",
        unit_scale=unit_bytes,
        desc=f"preparing {source.path.name}",
        disable=None,
    )
    batches: Iterator[tuple[dict[str, Any], int]]
    if source.kind == "jsonl":
        batches = _jsonl_batches(source.path)
    else:

        def arrow() -> Iterator[tuple[dict[str, Any], int]]:
            seen = 0
            for file, batch in _arrow_batches(source):
                yield _table_columns(batch, file, seen), batch.num_rows
                seen += batch.num_rows

        batches = arrow()
    try:
        for columns, progress in batches:
            if not writers:
                writers = {name: _ColumnWriter(folder, name) for name in columns}
            elif set(columns) != set(writers):
                raise InputError(
                    "some parts have an 'id' column and others not", file=str(source.path), field="id"
                )
            n = len(columns["title"])
            if "id" in columns and ids_are_rows:
                expected = np.arange(rows, rows + n).astype(str)
                ids = columns["id"]
                got = (
                    ids.to_numpy(zero_copy_only=False) if isinstance(ids, pa.Array | pa.ChunkedArray) else ids
                )
                ids_are_rows = bool(np.array_equal(np.asarray(got, dtype=str), expected))
            for name, values in columns.items():
                writers[name].append(values)
            rows += n
            bar.update(progress)
    finally:
        bar.close()
        for writer in writers.values():
            writer.close()
    if rows == 0:
        raise InputError("the corpus holds no passages", file=str(source.path))
    has_ids = "id" in writers and not ids_are_rows
    if "id" in writers and ids_are_rows:  # ids that equal row numbers need no column
        (folder / "id.bin").unlink()
        (folder / "id.offsets").unlink()
    if has_ids:
        _write_id_order(folder, rows, str(source.path))
    return {
        "format": STORE_FORMAT,
        "version": STORE_VERSION,
        "rows": rows,
        "ids": "column" if has_ids else "rows",
        "source": str(source.path.resolve()),
        "sources": source.stamps(),
        "complete": True,
    }


def _write_id_order(folder: Path, rows: int, name: str) -> None:
    """Rows sorted by id bytes (`id.order`), refusing duplicate ids."""
    column = _Column(folder, "id")
    try:
        offsets, data = column.memmaps(rows)
        ids = pa.LargeStringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(data))
        order = pc.sort_indices(ids).to_numpy()
        if rows > 1:
            ordered = pc.take(ids, pa.array(order))
            same = pc.equal(ordered.slice(1), ordered.slice(0, rows - 1))
            if pc.any(same).as_py():
                k = pc.index(same, True).as_py()
                a, b = sorted((int(order[k]), int(order[k + 1])))
                raise InputError(
                    f"duplicate passage id (rows {a} and {b})",
                    file=name,
                    record=ordered[k].as_py(),
                    field="id",
                )
        order.astype("<i8").tofile(folder / "id.order")
    finally:
        column.close()


def prepare_corpus(
    source: str | Path,
    out: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Convert a corpus source into a store once and return the store's folder.

    A store that is complete and was built from the same files (path, size, modification time) is
    reused; otherwise it is rebuilt in a temporary folder and renamed into place, so a reader never
    sees half a store. Concurrent callers serialise on a lock: one converts, the others reuse it. A
    store (and lock file) this call creates is removed again if the command that asked for it is then
    refused (corag.data.jsonl.removed_if_refused): a refused run leaves nothing beside the source.
    """
    found = _find_source(Path(source))
    store = Path(out) if out is not None else default_store_path(found.path, cache_dir)
    check_output(store, "--out", marks=("store.json",))  # --overwrite included
    stamps = found.stamps()
    lock = store.with_name(store.name + ".lock")
    for path in (p for p in (lock, store) if not p.exists()):  # a refused run removes what it made
        provisional(path)
    with locked(store, "preparing"):
        manifest = _read_manifest(store)
        if manifest is not None and manifest.get("sources") == stamps and not overwrite:
            return store
        with atomic_folder(store) as tmp:
            manifest = _write_store(found, tmp)
            (tmp / "store.json").write_text(json.dumps(manifest, indent=1))
    return store


# The corpus ----------------------------------------------------------------------------------------


class _SortedIds:
    """Bisection over ids in byte order (the `id.order` file), reading id bytes from memory maps."""

    def __init__(self, folder: Path, column: _Column, rows: int) -> None:
        self._offsets, self._data = column.memmaps(rows)
        self._order = (
            np.memmap(folder / "id.order", "<i8", "r", shape=(rows,)) if rows else np.zeros(0, "<i8")
        )
        self._n = rows

    def _key(self, i: int) -> bytes:
        row = int(self._order[i])
        return self._data[self._offsets[row] : self._offsets[row + 1]].tobytes()

    def row(self, doc_id: str) -> int | None:
        target = doc_id.encode()
        lo, hi = 0, self._n
        while lo < hi:
            mid = (lo + hi) // 2
            if self._key(mid) < target:
                lo = mid + 1
            else:
                hi = mid
        return int(self._order[lo]) if lo < self._n and self._key(lo) == target else None


class _Ids(Sequence[str]):
    """The corpus ids in row order, read on demand (no list of n strings is ever built)."""

    def __init__(self, corpus: Corpus) -> None:
        self._corpus = corpus

    def __len__(self) -> int:
        return len(self._corpus)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        n = len(self)
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step == 1:
                return self._corpus._id_range(start, max(start, stop))
            return [self[j] for j in range(start, stop, step)]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return self._corpus._id_range(i, i + 1)[0]

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self), _BATCH_ROWS):
            yield from self._corpus._id_range(start, min(start + _BATCH_ROWS, len(self)))


class Corpus:
    """Passages (`id`, `title`, `contents`) of a prepared store, read from disk on demand."""

    def __init__(self, store: str | Path, *, name: str | None = None) -> None:
        """Open a store folder written by `prepare_corpus`."""
        self.store = Path(store)
        manifest = _read_manifest(self.store)
        if manifest is None:
            raise InputError(
                "not a complete corpus store (prepare it with `corag corpus prepare`)", file=str(store)
            )
        self.name = name or manifest.get("source") or str(store)
        self._rows = int(manifest["rows"])
        self.ids_are_rows = manifest["ids"] == "rows"
        self.sources: list[dict[str, Any]] = manifest.get("sources", [])
        self._title, self._contents = _Column(self.store, "title"), _Column(self.store, "contents")
        self._id: _Column | None = None
        self._sorted: _SortedIds | None = None
        if manifest["ids"] == "column":
            self._id = _Column(self.store, "id")
            self._sorted = _SortedIds(self.store, self._id, self._rows)

    @classmethod
    def load(cls, source: str | Path, *, cache_dir: str | Path | None = None) -> Corpus:
        """A store folder as it is, or any source (see the module doc) prepared once, then opened."""
        path = Path(source)
        if path.is_dir() and (path / "store.json").is_file():
            return cls(path)
        return cls(prepare_corpus(path, cache_dir=cache_dir), name=str(path))

    def __len__(self) -> int:
        return self._rows

    def __getstate__(self) -> dict[str, Any]:  # reopened by path in another process
        return {"store": self.store, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["store"], name=state["name"])  # type: ignore[misc]

    @property
    def ids(self) -> Sequence[str]:
        """All ids in row order."""
        return _Ids(self)

    def empty_rows(self, start: int = 0, stop: int | None = None, block: int = 1 << 22) -> np.ndarray:
        """Rows start..stop-1 whose passage has neither title nor contents, from the stored offsets (no
        text is read)."""
        stop = self._rows if stop is None else min(stop, self._rows)
        title, contents = (
            np.memmap(self.store / f"{name}.offsets", "<i8", mode="r") for name in ("title", "contents")
        )
        found = []
        for a in range(start, stop, block):
            b = min(a + block, stop)
            sizes = np.diff(title[a : b + 1]) + np.diff(contents[a : b + 1])
            found.append(np.flatnonzero(sizes == 0) + a)
        return np.concatenate(found) if found else np.zeros(0, np.int64)

    def _id_range(self, start: int, stop: int) -> list[str]:
        return self._id.range(start, stop) if self._id is not None else [str(r) for r in range(start, stop)]

    def row(self, doc_id: str) -> int:
        """The row of `doc_id`; InputError naming the id when the corpus has no such passage."""
        row: int | None = None
        if self._sorted is not None:
            row = self._sorted.row(doc_id)
        elif doc_id.isascii() and doc_id.isdigit() and (doc_id == "0" or not doc_id.startswith("0")):
            row = int(doc_id)
        if row is None or row >= self._rows:
            raise InputError("unknown document id", file=self.name, record=doc_id, field="id")
        return row

    def get(self, doc_id: str) -> Passage:
        """The passage with id `doc_id`."""
        return self.passage(self.row(doc_id))

    def get_many(self, doc_ids: Sequence[str]) -> list[Passage]:
        """Passages for many ids, in the order asked; costs O(len(doc_ids)) reads."""
        return [self.passage(self.row(d)) for d in doc_ids]

    def fingerprint(self, samples: int = 1000) -> dict[str, Any]:
        """What identifies these passages cheaply at any size (an index records it, and is refused with
        another corpus): the row count and a hash of `samples` rows spread evenly over the store."""
        n = len(self)
        k = min(samples, n)
        rows = sorted({i * (n - 1) // max(k - 1, 1) for i in range(k)})  # every row when n <= samples
        digest = hashlib.sha256()
        for row in rows:
            p = self.passage(row)
            digest.update(f"{p.id}\x00{p.title}\x00{p.contents}\x01".encode())
        return {"rows": n, "sample_sha256": digest.hexdigest()[:32]}

    def passage(self, row: int) -> Passage:
        """The passage in row `row`."""
        doc_id = self._id.get(row) if self._id is not None else str(row)
        return Passage(doc_id, self._title.get(row), self._contents.get(row))

    def iter_batches(
        self, batch_size: int = 1024, start: int = 0, stop: int | None = None
    ) -> Iterator[list[Passage]]:
        """Passages of rows start..stop-1 in row order, `batch_size` at a time (sequential reads)."""
        stop = self._rows if stop is None else min(stop, self._rows)
        for a in range(start, stop, batch_size):
            b = min(a + batch_size, stop)
            columns = zip(
                self._id_range(a, b), self._title.range(a, b), self._contents.range(a, b), strict=True
            )
            yield [Passage(i, t, c) for i, t, c in columns]


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


def _check_one_text(
    named: dict[str, tuple[str, str | None, str]], paragraph: dict[str, Any], file: str | None, question: str
) -> None:
    """HotpotQA and 2WikiMultihopQA name a paragraph by its title (their supporting facts cite titles), so
    one title with two texts, in one file or two, is refused: which text the corpus gives the title would
    depend on the order of the files. MuSiQue numbers paragraphs within a question (`idx`), and its
    titles name many paragraphs: those are told apart by their text alone."""
    if "idx" in paragraph:
        return
    title, text = paragraph["title"], paragraph["text"]
    first_text, first_file, first_question = named.setdefault(title, (text, file, question))
    if first_text != text:
        raise InputError(
            f"paragraph {title!r} has another text here than in {first_file or 'the examples given'} (question "
            f"{first_question!r}); a title names one paragraph in HotpotQA and 2Wiki: build one corpus per "
            "file, or correct one of them",
            file=file,
            record=question,
            field="context",
        )


def corpus_from_contexts(sources: Iterable[Example | str | Path], out: str | Path) -> ContextCorpus:
    """Build a retrieval corpus from the context paragraphs of HotpotQA, 2WikiMultihopQA and MuSiQue
    questions (examples, or files that `load_examples` reads), de-duplicated by (title, text) as IRCoT
    did; a HotpotQA or 2Wiki title with two texts is refused (`_check_one_text`). Ids are row numbers in
    first-seen order. Writes corpus JSONL to `out` (atomically) and returns
    the examples with `supporting_ids` (and MuSiQue step `doc_ids`) pointing into it. Examples without
    context paragraphs pass through unchanged."""
    from corag.data.formats import load_examples

    sources = list(sources)
    examples: list[Example] = []
    files: list[str | None] = []  # the file of each example
    for source in sources:
        loaded = load_examples(source) if isinstance(source, str | Path) else [source]
        examples.extend(loaded)
        files.extend([str(source) if isinstance(source, str | Path) else None] * len(loaded))
    ids: dict[tuple[str, str], str] = {}
    title_ids: dict[str, list[str]] = {}
    named: dict[str, tuple[str, str | None, str]] = {}  # title -> (text, file, question) where it was first
    for example, file in zip(examples, files, strict=True):
        for p in example.meta.get("paragraphs") or []:
            _check_one_text(named, p, file, example.id)
            key = (p["title"], p["text"])
            if key not in ids:
                ids[key] = str(len(ids))
                title_ids.setdefault(p["title"], []).append(ids[key])
    if not ids:
        raise InputError(
            "no context paragraphs in the questions: nothing to build a corpus of (HotpotQA, 2Wiki and "
            "MuSiQue files carry them)",
            file=str(next((s for s in sources if isinstance(s, str | Path)), "")) or None,
        )
    write_corpus_jsonl(out, (Passage(i, title, text) for (title, text), i in ids.items()))
    filled = [_with_context_ids(e, ids) if e.meta.get("paragraphs") else e for e in examples]
    return ContextCorpus(Path(out), filled, ids, title_ids)


def default_questions_path(corpus_path: str | Path) -> Path:
    """Where `corag corpus from-contexts` writes the questions: `<corpus stem>.questions.jsonl` beside it."""
    path = Path(corpus_path)
    return path.with_name(f"{path.with_suffix('').name}.questions.jsonl")  # the whole stem: no collisions


def write_context_corpus(
    sources: Sequence[str | Path], out: str | Path, questions: str | Path | None = None
) -> tuple[ContextCorpus, Path]:
    """`corpus_from_contexts`, then the questions with their gold passage ids as the project's question
    JSONL (atomically), so evaluating them reports passage recall. Returns the corpus and that path."""
    from corag.data.formats import example_to_record

    path = Path(questions) if questions else default_questions_path(out)
    refuse_inputs_as_outputs({"--out": out, "--questions": path}, sources)
    check_output(out, "--out", keys=("id", "contents"))
    check_output(path, "--questions", keys=("id", "query"))
    built = corpus_from_contexts(sources, out)
    with atomic_write(path) as f:
        for example in built.examples:
            f.write(dumps(example_to_record(example)) + "\n")
    return built, path
