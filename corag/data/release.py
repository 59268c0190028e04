"""The released CoRAG question sets (`corag/multihopqa`, `corag/kilt`), as `hf download` writes them,
turned into the questions files the configs name, with the task on every record.

Layout on disk after `hf download corag/multihopqa --repo-type dataset --local-dir DIR` (or the
snapshot folder it prints without `--local-dir`): `DIR/<subset>/<split>-NNNNN-of-MMMMM.parquet`, beside
`README.md` and `.cache/`, which are ignored. Where these facts come from:

- corag/multihopqa: the repository's file list (huggingface.co/datasets/corag/multihopqa/tree/main and
  the file list of a verbatim duplicate, KOJKO/multihopqa commit 32af13b, "Duplicate from
  corag/multihopqa"): `2wikimultihopqa/`, `hotpotqa/`, `musique/` with `train-00000-of-00001.parquet` and
  `validation-00000-of-00001.parquet`, `bamboogle/` with `test-00000-of-00001.parquet`; its dataset card
  (`configs: data_files: path: 2wikimultihopqa/train-*`, ...) and its columns (`dataset_info`: `query,
  answers, query_id, context_doc_ids, subqueries, subanswers, predictions`, no `task`; the official
  inference, microsoft/LMOps `corag/src/inference/run_inference.py`, loads one subset at a time and adds
  the task description itself).
- corag/kilt: the repository's file list (huggingface.co/datasets/corag/kilt/tree/main and its task
  folders): twelve folders `aidayago2, blink, cweb, eli5, fever, hotpotqa, nq, structured_zeroshot, trex,
  triviaqa, wned, wow`, each with the splits it publishes (`blink` train only, `wned` validation and test)
  and `eli5`'s train in two shards (`train-00000-of-00002.parquet`, `train-00001-of-00002.parquet`).
  Its columns were not found published: each file is read by the loader its keys select
  (`corag.data.formats.detect_format`), the `corag/multihopqa` columns and KILT's own both load.

Which subsets to read is an argument (`subsets`, default every folder found); a split whose shards are
not all there is refused as an incomplete download.

Each published split becomes `<subset>_<split>.jsonl` and all train splits together become one
`train.jsonl`. A record is the published one plus `task`: the subset's task as `corag.tasks` names it
(in corag/kilt, `hotpotqa` is `kilt_hotpotqa`), since the parquet has none and a combined file cannot
be told apart by its name. A manifest (`prepare-data.json`) records each file written, its inputs and
its hash: a rerun skips files that are up to date, and a file not written here is never replaced
unless asked.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from corag.data.formats import detect_format, load_examples
from corag.data.jsonl import atomic_write, dumps, file_sha256
from corag.errors import InputError
from corag.tasks import get_task

DATASETS = ("multihopqa", "kilt")
MANIFEST = "prepare-data.json"
MANIFEST_VERSION = 1
TRAIN_FILE = "train.jsonl"
_SHARD = re.compile(r"^(?P<split>[a-z_]+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.parquet$")


@dataclass(frozen=True)
class Split:
    """One published split of one subset: its task and its parquet shards, in order."""

    subset: str
    split: str
    task: str
    files: tuple[Path, ...]


@dataclass(frozen=True)
class Output:
    """One questions file to write and the splits it is made of."""

    name: str
    splits: tuple[Split, ...]


@dataclass(frozen=True)
class Written:
    """What `prepare_release` did to one file: its path, its records, and whether it was (re)written."""

    path: Path
    records: int
    written: bool


def _subset_task(folder: Path, dataset: str) -> str:
    """The task of a subset folder; a subset of the other dataset is an error naming `--dataset`."""
    kilt = dataset == "kilt"
    task = get_task(folder.name, kilt=kilt, field="subset", file=str(folder))
    if task.is_kilt != kilt:
        other = "kilt" if task.is_kilt else "multihopqa"
        raise InputError(
            f"{folder.name!r} is a subset of corag/{other}, not corag/{dataset}: pass --dataset {other}",
            file=str(folder),
            field="--dataset",
        )
    return task.name


def _splits_of(folder: Path, task: str) -> list[Split]:
    """The splits of one subset folder, each with all its shards (else an InputError)."""
    shards: dict[str, dict[int, Path]] = {}
    counts: dict[str, set[int]] = {}
    for path in sorted(folder.glob("*.parquet")):
        m = _SHARD.match(path.name)
        if not m:
            raise InputError(
                "not a split file as `hf download` writes them (<split>-00000-of-00001.parquet)",
                file=str(path),
            )
        shards.setdefault(m["split"], {})[int(m["index"])] = path
        counts.setdefault(m["split"], set()).add(int(m["count"]))
    splits = []
    for split, files in sorted(shards.items()):
        if len(counts[split]) > 1:
            raise InputError(
                f"split {split!r}: its shards disagree on their count {sorted(counts[split])}: the download "
                "looks mixed, run `hf download` again",
                file=str(folder),
            )
        (count,) = counts[split]
        missing = sorted(set(range(count)) - set(files))
        if missing:
            raise InputError(
                f"split {split!r}: shards {missing} of {count} are missing: the download looks incomplete, "
                "run `hf download` again",
                file=str(folder),
            )
        splits.append(Split(folder.name, split, task, tuple(files[i] for i in range(count))))
    return splits


def find_splits(
    source: str | Path, dataset: str = "multihopqa", subsets: Sequence[str] | None = None
) -> list[Split]:
    """Every split under `source` (`<subset>/<split>-NNNNN-of-MMMMM.parquet`), of the chosen `subsets`."""
    source = Path(source)
    if dataset not in DATASETS:
        raise InputError(
            f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}", field="--dataset"
        )
    if not source.is_dir():
        raise InputError("no such folder (the folder `hf download --local-dir` wrote)", file=str(source))
    folders = {
        p.name: p
        for p in sorted(source.iterdir())
        if p.is_dir() and not p.name.startswith(".") and any(p.glob("*.parquet"))
    }
    if subsets:
        unknown = [s for s in subsets if s not in folders]
        if unknown:
            raise InputError(
                f"no subset folder {unknown[0]!r} with parquet files; found: {', '.join(folders) or 'none'}",
                file=str(source),
                field="--subsets",
            )
        folders = {s: folders[s] for s in subsets}
    if not folders:
        raise InputError(
            f"no <subset>/<split>-00000-of-00001.parquet files: point at the folder that `hf download "
            f"corag/{dataset} --repo-type dataset --local-dir DIR` wrote",
            file=str(source),
        )
    return [
        split for folder in folders.values() for split in _splits_of(folder, _subset_task(folder, dataset))
    ]


def plan_outputs(splits: Sequence[Split]) -> list[Output]:
    """`<subset>_<split>.jsonl` for each split but train; all train splits in one `train.jsonl`."""
    outputs = [Output(f"{s.subset}_{s.split}.jsonl", (s,)) for s in splits if s.split != "train"]
    train = tuple(s for s in splits if s.split == "train")
    return outputs + ([Output(TRAIN_FILE, train)] if train else [])


def _files(output: Output) -> Iterator[tuple[Split, Path]]:
    return ((split, path) for split in output.splits for path in split.files)


def _fingerprint(output: Output, source: Path) -> list[dict[str, Any]]:
    """The inputs of an output as the manifest records them: path under the source, size, mtime."""
    inputs = []
    for split, path in _files(output):
        st = path.stat()
        inputs.append(
            {
                "path": path.relative_to(source).as_posix(),
                "task": split.task,
                "size": st.st_size,
                "mtime_ns": st.st_mtime_ns,
            }
        )
    return inputs


def _read_manifest(out: Path) -> dict[str, Any]:
    path = out / MANIFEST
    if not path.exists():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"not a manifest this command wrote ({e})", file=str(path)) from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise InputError("not a manifest this command wrote", file=str(path), field="files")
    return files


def _is_ours(path: Path, entry: Any) -> bool:
    """Whether `path` is, byte for byte, the file the manifest says this command wrote."""
    return (
        isinstance(entry, dict)
        and path.stat().st_size == entry.get("size")
        and file_sha256(path) == entry.get("sha256")
    )


def _check(output: Output, progress: bool) -> int:
    """Load every input of `output` with the project's loaders (bad records are one-line errors naming
    file, record and field) and check ids are unique across them; returns the number of records."""
    first_file: dict[str, Path] = {}
    for split, path in tqdm(
        list(_files(output)), desc=f"checking {output.name}", unit=" files", disable=not progress or None
    ):
        field = "query_id" if detect_format(path) == "multihopqa" else "id"
        for example in load_examples(path, task=split.task):
            if example.id in first_file:
                raise InputError(
                    f"duplicate id across the files of {output.name} (also in {first_file[example.id]})",
                    file=str(path),
                    record=example.id,
                    field=field,
                )
            first_file[example.id] = path
    return len(first_file)


def _line(record: dict[str, Any], path: Path, index: int) -> str:
    try:
        return dumps(record)
    except (TypeError, ValueError) as e:
        bad = next((k for k, v in record.items() if not _json_ok(v)), None)
        raise InputError(
            f"record #{index}: a value JSON cannot hold ({e})", file=str(path), field=bad
        ) from None


def _json_ok(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _write(output: Output, target: Path, records: int, progress: bool) -> None:
    """The published records of `output`'s splits, in order, each with its `task`, written atomically."""
    import pyarrow.parquet as pq

    bar = tqdm(total=records, desc=f"writing {output.name}", unit=" questions", disable=not progress or None)
    with bar, atomic_write(target) as f:
        for split, path in _files(output):
            index = 0
            for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
                for record in batch.to_pylist():
                    f.write(_line({**record, "task": split.task}, path, index) + "\n")
                    index += 1
                bar.update(batch.num_rows)


def prepare_release(
    source: str | Path,
    out: str | Path,
    *,
    dataset: str = "multihopqa",
    subsets: Sequence[str] | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> list[Written]:
    """Write the questions files of a downloaded release into `out` (see the module's docstring).

    Files already up to date (same inputs, unchanged since written here) are left alone; a file in the
    way that this command did not write (or that changed since) is an InputError unless `overwrite`.
    Every input is checked before anything is written, and each file is replaced whole, so an
    interrupted run leaves finished files in place and a rerun writes only the rest."""
    source, out = Path(source), Path(out)
    outputs = plan_outputs(find_splits(source, dataset, subsets))
    manifest = _read_manifest(out)
    todo, results, refused = [], {}, []
    for output in outputs:
        target = out / output.name
        inputs = _fingerprint(output, source)
        entry = manifest.get(output.name)
        if not target.exists():
            todo.append((output, inputs))
        elif _is_ours(target, entry) and entry.get("dataset", dataset) != dataset and not overwrite:
            refused.append((target, f"was written from corag/{entry['dataset']}, not corag/{dataset}"))
        elif _is_ours(target, entry):
            if entry.get("inputs") == inputs and entry.get("version") == MANIFEST_VERSION:
                results[output.name] = Written(target, int(entry.get("records", 0)), False)
            else:
                todo.append((output, inputs))
        elif overwrite:
            todo.append((output, inputs))
        else:
            refused.append((target, "was not written by `corag prepare-data` (or was changed since)"))
    if refused:
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise InputError(
            f"exists and {refused[0][1]}{more}: move it away, choose another --out or pass --overwrite",
            file=str(refused[0][0]),
        )
    counts = {output.name: _check(output, progress) for output, _ in todo}
    for output, inputs in todo:
        target = out / output.name
        _write(output, target, counts[output.name], progress)
        manifest[output.name] = {
            "version": MANIFEST_VERSION,
            "dataset": dataset,
            "records": counts[output.name],
            "size": target.stat().st_size,
            "sha256": file_sha256(target),
            "source": os.path.abspath(source),
            "inputs": inputs,
        }
        with atomic_write(out / MANIFEST) as f:  # after each file: an interrupted run resumes from here
            json.dump({"written_by": "corag prepare-data", "files": manifest}, f, indent=1)
        results[output.name] = Written(target, counts[output.name], True)
    return [results[output.name] for output in outputs]
