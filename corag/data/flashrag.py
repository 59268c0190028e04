"""The Search-R1 suite as published, laid out where the configs and pages look for it.

    hf download RUC-NLPIR/FlashRAG_datasets --repo-type dataset --local-dir FlashRAG_datasets \
        --include "nq/*" "triviaqa/*" "popqa/*" "hotpotqa/*" "2wikimultihopqa/*" "musique/*" "bamboogle/*"
    hf download PeterJinGo/wiki-18-corpus --repo-type dataset --local-dir wiki-18
    corag prepare-data FlashRAG_datasets --dataset flashrag --wiki18 wiki-18/wiki-18.jsonl.gz --out data/flashrag

writes `data/flashrag/<set>/<split>.jsonl` for the split Search-R1 tests each set on (FlashRAG's folder
per set, each file byte for byte as published; every record checked by `corag.data.formats.load_flashrag`
first) and `data/flashrag/wiki-18.jsonl` (the corpus, decompressed when given as `.gz`). The splits are
those of Search-R1's scripts/data_process/qa_search_test_merge.py: a set's `test` split where FlashRAG
publishes one, else its `dev`. Files are written whole (a temporary file renamed), a rerun leaves files
that are up to date alone, and a file in the way that this command did not write is refused unless
`overwrite`.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corag.data.formats import load_flashrag
from corag.data.jsonl import atomic_write, file_sha256
from corag.data.release import MANIFEST, Written
from corag.errors import InputError

# The seven sets in the leaderboard's order and the split Search-R1 evaluates each on.
SUITE = {
    "nq": "test",
    "triviaqa": "test",
    "popqa": "test",
    "hotpotqa": "dev",
    "2wikimultihopqa": "dev",
    "musique": "dev",
    "bamboogle": "test",
}
WIKI18 = "wiki-18.jsonl"


def suite_files(out: str | Path, sets: Sequence[str] | None = None) -> list[Path]:
    """The questions files of the suite under `out`: `<set>/<split>.jsonl`, in the leaderboard's order."""
    return [Path(out) / name / f"{SUITE[name]}.jsonl" for name in (sets or SUITE)]


def _manifest(out: Path) -> dict[str, Any]:
    path = out / MANIFEST
    if not path.exists():
        return {}
    try:
        return dict(json.loads(path.read_text())["files"])
    except (ValueError, KeyError, TypeError):
        raise InputError("not a manifest `corag prepare-data` wrote", file=str(path)) from None


def _source_key(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"source": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _check_wiki18(path: Path) -> None:
    """The first line of the corpus is a wiki-18 line (`{"id", "contents"}`); the whole file is checked
    when `corag index` prepares it."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            first = json.loads(f.readline())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise InputError(f"not a wiki-18 corpus ({type(e).__name__}: {e})", file=str(path), line=1) from None
    if not isinstance(first, dict) or not {"id", "contents"} <= first.keys():
        raise InputError('expected {"id", "contents"} lines, as wiki-18 is published', file=str(path), line=1)


def _copy(source: Path, target: Path) -> None:
    """`source` to `target`, decompressed when it is `.gz`, written whole."""
    target.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rb") as f, atomic_write(target, "wb") as g:
        shutil.copyfileobj(f, g, 1 << 24)


def prepare_flashrag(
    source: str | Path,
    out: str | Path,
    *,
    sets: Sequence[str] | None = None,
    wiki18: str | Path | None = None,
    overwrite: bool = False,
) -> list[Written]:
    """Lay out the suite's questions files (and wiki-18, when given) under `out` (see the module's
    docstring). Every input is checked before anything is written."""
    source, out = Path(source), Path(out)
    names = list(sets or SUITE)
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        raise InputError(f"not one of the suite's sets ({', '.join(SUITE)}): {unknown[0]}", field="subsets")
    manifest = _manifest(out)
    plan: list[tuple[Path, Path, int | None]] = []  # (source, target, records)
    for name, target in zip(names, suite_files(out, names), strict=True):
        path = source / name / target.name
        if not path.is_file():
            raise InputError(
                f"missing: download it with hf download RUC-NLPIR/FlashRAG_datasets --repo-type dataset "
                f'--local-dir {source} --include "{name}/*"',
                file=str(path),
            )
        plan.append((path, target, len(load_flashrag(path))))
    if wiki18 is not None:
        _check_wiki18(Path(wiki18))
        plan.append((Path(wiki18), out / WIKI18, None))
    results, todo = [], []
    for path, target, records in plan:
        key = target.relative_to(out).as_posix()
        entry = manifest.get(key)
        ours = target.exists() and isinstance(entry, dict) and entry.get("size_out") == target.stat().st_size
        if ours and entry.get("input") == _source_key(path):
            results.append(Written(target, int(entry.get("records") or 0), False))
        elif target.exists() and not ours and not overwrite:
            raise InputError(
                "exists and was not written by `corag prepare-data`: move it away, choose another --out or "
                "pass --overwrite",
                file=str(target),
            )
        else:
            todo.append((path, target, records))
            results.append(Written(target, records or 0, True))
    for path, target, records in todo:
        _copy(path, target)
        manifest[target.relative_to(out).as_posix()] = {
            "input": _source_key(path),
            "records": records,
            "size_out": target.stat().st_size,
            "sha256": file_sha256(target) if records is not None else None,
        }
        with atomic_write(out / MANIFEST) as f:  # after each file: an interrupted run resumes from here
            json.dump({"written_by": "corag prepare-data", "files": manifest}, f, indent=1)
    return results
