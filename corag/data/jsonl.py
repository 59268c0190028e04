"""Files read and written safely: the one JSONL reader, the one atomic writer, the one file lock.

Reading names the file and line of any malformed record. Writers never leave a half-written file:
`atomic_write` writes a temporary file and renames it; `JsonlAppender` appends whole lines and, on
reopening, repairs a truncated last line that a crash may have left. `locked` lets one process build
a file or folder while the others wait for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from corag.errors import InputError


def _parse_line(text: str | bytes, path: Path, line_no: int) -> dict[str, Any]:
    """One JSON object from one line, or an InputError naming file and line."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(
            f"malformed JSON ({e.msg} at column {e.colno}): not valid JSON", file=str(path), line=line_no
        ) from None
    if not isinstance(record, dict):
        raise InputError(f"expected a JSON object, got {type(record).__name__}", file=str(path), line=line_no)
    return record


def input_file(source: str | Path) -> Path:
    """`source` as a Path to an existing, non-empty file, or an InputError saying what it is instead."""
    path = Path(source)
    if path.is_dir():
        raise InputError("is a folder, not a file", file=str(path))
    if not path.is_file():
        raise InputError("no such file", file=str(path))
    if path.stat().st_size == 0:
        raise InputError("empty file: no records", file=str(path))
    return path


def open_parquet(path: str | Path) -> Any:
    """`pyarrow.parquet.ParquetFile` of `path`, or an InputError when its bytes are not parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"not a parquet file ({str(e).split('.')[0]})", file=str(path)) from None


def is_parquet(path: str | Path) -> bool:
    """Whether the file's bytes start as parquet's do (`PAR1`), whatever its name."""
    with open(path, "rb") as f:
        return f.read(4) == b"PAR1"


def decode_line(raw: bytes, path: Path, line_no: int) -> str:
    """One line of a UTF-8 file as text, or an InputError naming the line and the byte's column."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})",
            file=str(path),
            line=line_no,
        ) from None


def iter_jsonl(
    path: str | Path, on_bytes: Callable[[int], None] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (1-based line number, record) for every non-blank line; a malformed line, or one that is
    not UTF-8, is an InputError (a last line without its newline is named as a file cut short).
    `on_bytes`, if given, is called with each line's size in bytes (for a progress bar)."""
    path = Path(path)
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if on_bytes is not None:
                on_bytes(len(raw))
            line = decode_line(raw, path, line_no)
            if line_no == 1:
                line = line.removeprefix("\ufeff")  # a UTF-8 BOM, accepted as every loader accepts it
            if not line.strip():
                continue
            try:
                yield line_no, _parse_line(line, path, line_no)
            except InputError as error:
                if raw.endswith(b"\n") or "malformed JSON" not in str(error):
                    raise
                raise InputError(
                    f"{error.message}; the last line has no newline: the file looks cut short",
                    file=str(path),
                    line=line_no,
                ) from None


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All records of a JSONL file (blank lines skipped)."""
    return [record for _, record in iter_jsonl(path)]


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file beside `path` (`.tmp-NAME.*.tmp`, text in UTF-8 or, with mode "wb", bytes);
    on success it is flushed to disk and replaces `path`, on error it is removed.

    Readers therefore see either the old file or the complete new one, never a partial one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_folder(target: str | Path) -> Iterator[Path]:
    """A temporary folder beside `target`; on success it replaces `target` whole, on error it is removed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# Paths the innermost `removed_if_refused` block created beside its inputs (a stack: blocks may nest).
_PROVISIONAL: list[list[Path]] = []


def provisional(path: str | Path) -> None:
    """Record that this run created `path` (a file or folder beside an input, such as a corpus store):
    it is removed again if the run is refused (`removed_if_refused`)."""
    if _PROVISIONAL:
        _PROVISIONAL[-1].append(Path(path))


@contextlib.contextmanager
def removed_if_refused() -> Iterator[None]:
    """Run a command so that a refusal (an InputError) leaves the folders of its inputs as it found them:
    what it created there and recorded with `provisional` is removed before the error goes on. Kept
    when the run succeeds or fails otherwise (an interrupted conversion is worth reusing)."""
    made: list[Path] = []
    _PROVISIONAL.append(made)
    try:
        yield
    except InputError:
        for path in reversed(made):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        raise
    finally:
        _PROVISIONAL.pop()


@contextlib.contextmanager
def locked(path: str | Path, doing: str = "writing") -> Iterator[None]:
    """An exclusive lock on `PATH.lock`: one process builds `path` while the others wait (no timeout);
    a process that has to wait says so on stderr ("waiting for another process DOING PATH")."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process {doing} {path}", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def refuse_inputs_as_outputs(outputs: Mapping[str, str | Path | None], inputs: Iterable[str | Path]) -> None:
    """An output (option name -> path) that is one of the inputs, or another output, would be
    destroyed by the writing: refused in one line naming the option, before anything is read."""
    seen: dict[Path, str] = {}
    for path in inputs:
        seen.setdefault(Path(path).resolve(), "an input")
    for option, path in outputs.items():
        if path is None:
            continue
        resolved = Path(path).resolve()
        if resolved in seen:
            raise InputError(
                f"{option} is also {seen[resolved]}: writing it would destroy it; choose another path",
                file=str(path),
                field=option,
            )
        seen[resolved] = f"the path of {option}"


def check_output(
    path: str | Path, option: str, *, marks: Sequence[str] = (), keys: Sequence[str] | None = None
) -> None:
    """Refuse, in one line, an existing output that corag did not write, before anything is written.

    With `marks` the output is a folder: it is ours when it is empty or holds a file matching one of
    the marks (glob patterns of what the command writes there). Otherwise it is a file: ours when it is
    empty or starts with a JSON object (with every one of `keys`, when given, on its first line). A
    path of the other kind (a file where a folder goes, or the reverse) is refused likewise, and so is a
    new path under a file (it cannot be made there)."""
    path = Path(path)
    if not path.exists():
        parent = next((p for p in path.parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            raise InputError(
                f"is a file, so {option} cannot be made under it: choose another path",
                file=str(parent),
                field=option,
            )
        return
    folder = bool(marks)
    if folder != path.is_dir():
        kind = "a folder" if folder else "a file"
        raise InputError(
            f"{option} names {kind}, and this is not one: choose another path", file=str(path), field=option
        )
    if folder:
        names = sorted(p.name for p in path.iterdir())
        if not names or any(next(path.glob(mark), None) for mark in marks):
            return
        raise InputError(
            f"the folder holds files corag did not write ({', '.join(names[:3])}"
            f"{', ...' if len(names) > 3 else ''}): choose another {option}, or empty it",
            file=str(path),
            field=option,
        )
    with path.open("rb") as f:
        first = f.readline(1 << 20)
    if not first.strip() or _starts_our_record(first, keys):
        return
    raise InputError(
        f"the file holds what corag did not write: choose another {option}, or remove it",
        file=str(path),
        field=option,
    )


def _starts_our_record(first_line: bytes, keys: Sequence[str] | None) -> bool:
    if not first_line.lstrip().startswith(b"{"):
        return False
    if keys is None:
        return True
    try:
        record = json.loads(first_line)
    except ValueError:
        return False
    return isinstance(record, dict) and all(key in record for key in keys)


WAIT_POLL_S = 5.0  # how often wait_for_file looks


def wait_for_file(path: str | Path, doing: str = "building") -> None:
    """Wait (no timeout) until `path` exists: another process is DOING what it marks as finished, and
    it appears whole (by a rename). Processes that never build wait this way instead of on `locked`, so
    nodes sharing a file system whose locks do not reach across nodes (Lustre without `flock`, NFS
    without a lock daemon) never build the same folder at once."""
    path = Path(path)
    waited = 0.0
    while not path.exists():
        if waited % 600 == 0:
            print(
                f"waiting for the first process {doing} {path.parent} ({waited:.0f} s so far)",
                file=sys.stderr,
            )
        time.sleep(WAIT_POLL_S)
        waited += WAIT_POLL_S


def dumps(record: Mapping[str, Any]) -> str:
    """One record as one JSON line (no trailing newline); non-ASCII kept as is."""
    return json.dumps(record, ensure_ascii=False)


def write_jsonl(path: str | Path, records: Iterable[Mapping[str, Any]]) -> int:
    """Write all records atomically; returns how many were written."""
    n = 0
    with atomic_write(path) as f:
        for record in records:
            f.write(dumps(record) + "\n")
            n += 1
    return n


def recover_jsonl(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """Read an append-only JSONL file after a possible crash and repair it in place.

    A last line without its newline is a write cut short: it is dropped (and cut from the file) when
    it does not parse, or completed with a newline when it does. Returns (records, dropped lines).
    A malformed line anywhere else is still an InputError: that is damage, not an interrupted append.
    """
    path = Path(path)
    if not path.exists():
        return [], 0
    data = path.read_bytes()
    complete_end = data.rfind(b"\n") + 1  # bytes up to and including the last newline

    def parse(raw: bytes, line_no: int) -> dict[str, Any]:
        text = decode_line(raw, path, line_no)
        return _parse_line(text.removeprefix("\ufeff") if line_no == 1 else text, path, line_no)

    records = [
        parse(line, i) for i, line in enumerate(data[:complete_end].split(b"\n"), start=1) if line.strip()
    ]
    tail = data[complete_end:]
    if not tail.strip():
        return records, 0
    tail_line = data[:complete_end].count(b"\n") + 1
    try:
        records.append(parse(tail, tail_line))
    except InputError:  # cut short, perhaps inside a character
        with path.open("r+b") as f:
            f.truncate(complete_end)
        return records, 1
    with path.open("ab") as f:
        f.write(b"\n")
    return records, 0


class JsonlAppender:
    """Append records one whole line at a time, flushed (and fsynced) so a crash loses at most one.

    Opening an existing file first repairs it with `recover_jsonl`; `existing` holds the records
    already there (to skip finished work when resuming) and `dropped` how many partial lines went.
    """

    def __init__(self, path: str | Path, *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.existing, self.dropped = recover_jsonl(self.path)
        self._fsync = fsync
        self._f: IO[str] | None = self.path.open("a", encoding="utf-8")

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record as a complete line and push it to disk."""
        if self._f is None:
            raise ValueError(f"{self.path}: appender is closed")
        self._f.write(dumps(record) + "\n")
        self._f.flush()
        if self._fsync:
            os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Field validation ---------------------------------------------------------------------------------

_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "a list",
    dict: "an object",
}


def _type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)


def check_fields(
    record: Mapping[str, Any],
    required: Mapping[str, type | tuple[type, ...]],
    optional: Mapping[str, type | tuple[type, ...]] | None = None,
    *,
    file: str | Path | None = None,
    line: int | None = None,
    record_id: str | None = None,
) -> None:
    """Raise InputError for a missing required field or a field of the wrong type (None is allowed
    for optional fields). bool is not accepted where an int is asked for."""
    where = {"file": str(file) if file is not None else None, "line": line, "record": record_id}
    for name in required:
        if name not in record:
            raise InputError("missing required field", field=name, **where)
    for name, kind in {**required, **(optional or {})}.items():
        value = record.get(name)
        if value is None and name not in required:
            continue
        ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in _as_tuple(kind))
        if not ok:
            raise InputError(f"expected {_type_name(kind)}, got {type(value).__name__}", field=name, **where)


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def check_str_list(
    value: Any,
    field: str,
    *,
    non_empty: bool = False,
    file: str | Path | None = None,
    line: int | None = None,
    record_id: str | None = None,
) -> tuple[str, ...]:
    """A list of strings as a tuple; InputError if it is not one, or (with non_empty) if it has no
    non-blank string."""
    where = {
        "file": str(file) if file is not None else None,
        "line": line,
        "record": record_id,
        "field": field,
    }
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise InputError(f"expected a list of strings, got {value!r:.80}", **where)
    if non_empty and not any(v.strip() for v in value):
        raise InputError("must hold at least one non-empty string", **where)
    return tuple(value)


class UniqueIds:
    """Remembers ids already seen in one file and raises InputError on a repeat."""

    def __init__(self, file: str | Path | None = None) -> None:
        self.file = str(file) if file is not None else None
        self._first: dict[str, int | None] = {}

    def add(self, record_id: str, line: int | None = None, field: str = "id") -> None:
        if record_id in self._first:
            first = self._first[record_id]
            seen = f" (first on line {first})" if first is not None else ""
            raise InputError(f"duplicate id{seen}", file=self.file, line=line, record=record_id, field=field)
        self._first[record_id] = line
