"""Loaders for the question files of each benchmark, in the formats they are published in.

Every loader returns `list[Example]` and raises InputError naming the file, line or record id, and
field for bad input. Datasets that come with context paragraphs (HotpotQA, 2WikiMultihopQA, MuSiQue)
keep them in `meta["paragraphs"]` as `{"title", "text", "is_supporting"}` dicts, so that
`corag.data.corpus.corpus_from_contexts` can build a retrieval corpus and fill `supporting_ids`
(and MuSiQue's per-step `doc_ids`) with that corpus's ids. Loaders leave those ids empty, since their
meaning depends on which corpus is searched.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from corag.data.jsonl import UniqueIds, check_fields, check_str_list, iter_jsonl
from corag.errors import InputError
from corag.types import Example, Step

PathLike = str | Path


def _dedup(items: Iterable[str]) -> tuple[str, ...]:
    """Strip, drop empty strings and repeats, keep first-seen order."""
    seen: dict[str, None] = {}
    for item in items:
        item = item.strip()
        if item:
            seen.setdefault(item, None)
    return tuple(seen)


def _read_json_array(path: Path) -> list[Any]:
    """A whole-file JSON array (HotpotQA and 2Wiki ship one array per split)."""
    try:
        with path.open(encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON ({e.msg})", file=str(path), line=e.lineno) from None
    if not isinstance(data, list):
        raise InputError(f"expected a JSON array of records, got {type(data).__name__}", file=str(path))
    return data


def _records_of_array(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(record index, record) of a JSON array; errors name the record index as the position."""
    for i, record in enumerate(_read_json_array(path)):
        if not isinstance(record, dict):
            raise InputError(f"record {i}: expected a JSON object", file=str(path))
        yield i, record


def _record_id(record: dict[str, Any], key: str) -> str | None:
    value = record.get(key)
    return value if isinstance(value, str) else None


def _kw(where: dict[str, Any]) -> dict[str, Any]:
    """`where` (file/line/record) spelled as check_fields keyword arguments."""
    return {"file": where.get("file"), "line": where.get("line"), "record_id": where.get("record")}


# HotpotQA and 2WikiMultihopQA ---------------------------------------------------------------------


def _context_paragraphs(
    context: Any, supporting: set[str], joiner: str, where: dict[str, Any]
) -> list[dict[str, Any]]:
    """`[[title, [sentences]]]` as paragraph dicts. HotpotQA sentences carry their own leading
    spaces (joiner ""); 2Wiki sentences do not (joiner " ")."""
    if not isinstance(context, list):
        raise InputError("expected a list of [title, sentences]", field="context", **where)
    paragraphs = []
    for item in context:
        ok = (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], list)
            and all(isinstance(s, str) for s in item[1])
        )
        if not ok:
            raise InputError(f"expected [title, [sentences]], got {item!r:.80}", field="context", **where)
        text = joiner.join(s.strip() if joiner else s for s in item[1]).strip()
        paragraphs.append({"title": item[0], "text": text, "is_supporting": item[0] in supporting})
    return paragraphs


def _supporting_titles(facts: Any, where: dict[str, Any]) -> tuple[str, ...]:
    if not isinstance(facts, list) or not all(
        isinstance(f, list) and len(f) == 2 and isinstance(f[0], str) for f in facts
    ):
        raise InputError("expected a list of [title, sentence index]", field="supporting_facts", **where)
    return _dedup(f[0] for f in facts)


def load_hotpotqa(path: PathLike, *, task: str = "hotpotqa", keep_context: bool = True) -> list[Example]:
    """HotpotQA (distractor or fullwiki) JSON array: `_id, question, answer, supporting_facts, context,
    type, level`. Test files without answers are refused (nothing to evaluate against)."""
    path = Path(path)
    ids, examples = UniqueIds(path), []
    required = {"_id": str, "question": str, "answer": str, "supporting_facts": list}
    for i, r in _records_of_array(path):
        rid = _record_id(r, "_id")
        where = {"file": str(path), "record": rid if rid is not None else f"#{i}"}
        check_fields(
            r, required, {"context": list, "type": str, "level": str}, file=path, record_id=where["record"]
        )
        ids.add(r["_id"])
        if not r["answer"].strip():
            raise InputError("empty answer", field="answer", **where)
        titles = _supporting_titles(r["supporting_facts"], where)
        meta: dict[str, Any] = {"type": r.get("type"), "level": r.get("level")}
        if keep_context and "context" in r:
            meta["paragraphs"] = _context_paragraphs(r["context"], set(titles), "", where)
        examples.append(
            Example(
                id=r["_id"],
                query=r["question"].strip(),
                answers=(r["answer"].strip(),),
                task=task,
                supporting_titles=titles,
                meta=meta,
            )
        )
    return examples


def read_2wiki_aliases(path: PathLike) -> dict[str, tuple[str, ...]]:
    """2WikiMultihopQA's `id_aliases.json`: JSONL lines `{"Q_id", "aliases", ...}` as published, or
    a single JSON object mapping answer id -> list of aliases."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict) and "Q_id" not in whole:
        return {k: check_str_list(v, "aliases", file=path, record_id=k) for k, v in whole.items()}
    aliases: dict[str, tuple[str, ...]] = {}
    for line_no, r in iter_jsonl(path):
        check_fields(r, {"Q_id": str, "aliases": list}, file=path, line=line_no)
        aliases[r["Q_id"]] = check_str_list(
            r["aliases"], "aliases", file=path, line=line_no, record_id=r["Q_id"]
        )
    return aliases


def load_2wiki(
    path: PathLike,
    *,
    aliases: PathLike | dict[str, tuple[str, ...]] | None = None,
    task: str = "2wikimultihopqa",
    keep_context: bool = True,
) -> list[Example]:
    """2WikiMultihopQA JSON array: `_id, type, question, context, supporting_facts, evidences, answer`
    and, in the id-enhanced release, `answer_id` (with `aliases`, an id_aliases.json path or mapping,
    its aliases become extra gold answers, as the official evaluation does)."""
    path = Path(path)
    alias_map = read_2wiki_aliases(aliases) if isinstance(aliases, str | Path) else (aliases or {})
    ids, examples = UniqueIds(path), []
    required = {"_id": str, "question": str, "answer": str, "supporting_facts": list}
    optional = {"context": list, "type": str, "evidences": list, "answer_id": str, "entity_ids": str}
    for i, r in _records_of_array(path):
        rid = _record_id(r, "_id")
        where = {"file": str(path), "record": rid if rid is not None else f"#{i}"}
        check_fields(r, required, optional, file=path, record_id=where["record"])
        ids.add(r["_id"])
        if not r["answer"].strip():
            raise InputError("empty answer", field="answer", **where)
        titles = _supporting_titles(r["supporting_facts"], where)
        answer_id = r.get("answer_id")
        meta: dict[str, Any] = {
            "type": r.get("type"),
            "evidences": r.get("evidences", []),
            "answer_id": answer_id,
            "entity_ids": r.get("entity_ids"),
        }
        if keep_context and "context" in r:
            meta["paragraphs"] = _context_paragraphs(r["context"], set(titles), " ", where)
        examples.append(
            Example(
                id=r["_id"],
                query=r["question"].strip(),
                answers=_dedup([r["answer"], *alias_map.get(answer_id or "", ())]),
                task=task,
                supporting_titles=titles,
                meta=meta,
            )
        )
    return examples


# MuSiQue -------------------------------------------------------------------------------------------

_HOP_REF = re.compile(r"#(\d+)")


def _resolve_refs(question: str, answers: list[str]) -> str:
    """MuSiQue sub-questions refer to earlier answers as `#1`, `#2`: put the answers in."""

    def sub(m: re.Match[str]) -> str:
        k = int(m.group(1))
        return answers[k - 1] if 1 <= k <= len(answers) else m.group(0)

    return _HOP_REF.sub(sub, question)


def _musique_paragraphs(r: dict[str, Any], where: dict[str, Any]) -> list[dict[str, Any]]:
    paragraphs = []
    for j, p in enumerate(r["paragraphs"]):
        if not isinstance(p, dict):
            raise InputError(f"paragraph {j}: expected an object", field="paragraphs", **where)
        check_fields(
            p,
            {"title": str, "paragraph_text": str},
            {"idx": int, "is_supporting": bool},
            **_kw(where),
        )
        paragraphs.append(
            {
                "idx": p.get("idx", j),
                "title": p["title"],
                "text": p["paragraph_text"].strip(),
                "is_supporting": bool(p.get("is_supporting", False)),
            }
        )
    return paragraphs


def _musique_supporting_titles(paragraphs: list[dict[str, Any]], decomposition: list[Any]) -> tuple[str, ...]:
    """Titles of the supporting paragraphs, in hop order first (then any other supporting ones)."""
    by_idx = {p["idx"]: p for p in paragraphs}
    hops = [
        by_idx[d["paragraph_support_idx"]]["title"]
        for d in decomposition
        if d.get("paragraph_support_idx") in by_idx
    ]
    return _dedup([*hops, *(p["title"] for p in paragraphs if p["is_supporting"])])


def load_musique(
    path: PathLike, *, task: str = "musique", answerable_only: bool = True, keep_context: bool = True
) -> list[Example]:
    """MuSiQue JSONL (`musique_ans` or `musique_full`): answers are `answer` plus `answer_aliases`;
    the gold chain comes from `question_decomposition` with `#k` references filled in (the raw
    sub-questions and supporting paragraph indices stay in `meta["question_decomposition"]`).
    Unanswerable records of MuSiQue-Full are skipped unless `answerable_only=False`."""
    path = Path(path)
    ids, examples = UniqueIds(path), []
    required = {"id": str, "question": str, "answer": str, "paragraphs": list}
    optional = {"answer_aliases": list, "question_decomposition": list, "answerable": bool}
    for line_no, r in iter_jsonl(path):
        where = {"file": str(path), "line": line_no, "record": _record_id(r, "id")}
        check_fields(r, required, optional, **_kw(where))
        ids.add(r["id"], line_no)
        answerable = r.get("answerable", True)
        if answerable_only and not answerable:
            continue
        aliases = check_str_list(r.get("answer_aliases") or [], "answer_aliases", **_kw(where))
        answers = _dedup([r["answer"], *aliases])
        if answerable and not answers:
            raise InputError("empty answer", field="answer", **where)
        paragraphs = _musique_paragraphs(r, where)
        steps, sub_answers = [], []
        for k, d in enumerate(r.get("question_decomposition") or []):
            if not isinstance(d, dict):
                raise InputError(f"step {k}: expected an object", field="question_decomposition", **where)
            check_fields(d, {"question": str, "answer": str}, {"paragraph_support_idx": int}, **_kw(where))
            steps.append(
                Step(subquery=_resolve_refs(d["question"], sub_answers).strip(), subanswer=d["answer"])
            )
            sub_answers.append(d["answer"])
        meta: dict[str, Any] = {
            "answerable": answerable,
            "question_decomposition": r.get("question_decomposition") or [],
        }
        if keep_context:
            meta["paragraphs"] = paragraphs
        examples.append(
            Example(
                id=r["id"],
                query=r["question"].strip(),
                answers=answers,
                task=task,
                supporting_titles=_musique_supporting_titles(
                    paragraphs, r.get("question_decomposition") or []
                ),
                decomposition=tuple(steps),
                meta=meta,
            )
        )
    return examples


# Bamboogle -----------------------------------------------------------------------------------------


def load_bamboogle(path: PathLike, *, task: str = "bamboogle") -> list[Example]:
    """Bamboogle CSV without a header: question in column 0, answer in column 4, an alternative
    answer in column 5 when present. Ids are `bamboogle-<row>` (0-based row of the CSV)."""
    path = Path(path)
    examples = []
    with path.open(encoding="utf-8-sig", newline="") as f:
        for row_no, row in enumerate(csv.reader(f)):
            if not any(cell.strip() for cell in row):
                continue
            where = {"file": str(path), "record": f"bamboogle-{row_no}"}
            if len(row) < 5:
                raise InputError(f"expected at least 5 columns, got {len(row)}", field="column 4", **where)
            question = row[0].strip()
            if not question:
                raise InputError("empty question", field="column 0", **where)
            answers = _dedup([row[4], *(row[5:6])])
            if not answers:
                raise InputError("empty answer", field="column 4", **where)
            examples.append(Example(id=f"bamboogle-{row_no}", query=question, answers=answers, task=task))
    return examples


# KILT ----------------------------------------------------------------------------------------------

_KILT_SPLIT = re.compile(r"-(train|dev|test)[^-]*-kilt", re.IGNORECASE)


def kilt_task_from_name(path: PathLike) -> str:
    """The KILT task a file holds, from its official name: `hotpotqa-dev-kilt.jsonl` -> `hotpotqa`,
    `structured_zeroshot-train-kilt.jsonl` -> `structured_zeroshot`."""
    name = Path(path).name
    m = _KILT_SPLIT.search(name)
    if not m:
        raise InputError("cannot tell the KILT task from the file name; pass task=...", file=str(path))
    return name[: m.start()].lower()


def load_kilt(path: PathLike, *, task: str | None = None, require_answers: bool = True) -> list[Example]:
    """A KILT task file (any task): `id, input, output [{answer, provenance [{wikipedia_id, title}]}]`.

    Answers are the non-empty `answer` strings of all outputs (some outputs only carry provenance);
    `supporting_ids` are the provenance Wikipedia page ids (KILT knowledge-source ids, not passage
    rows of a chunked corpus) and `supporting_titles` their titles. Test files without outputs need
    `require_answers=False`.
    """
    path = Path(path)
    task = task or kilt_task_from_name(path)
    ids, examples = UniqueIds(path), []
    for line_no, r in iter_jsonl(path):
        where = {"file": str(path), "line": line_no, "record": _record_id(r, "id")}
        if isinstance(r.get("id"), int):  # some KILT files (e.g. zsRE) use integer-looking ids
            r["id"] = str(r["id"])
        check_fields(r, {"id": str, "input": str}, {"output": list}, **_kw(where))
        ids.add(r["id"], line_no)
        answers, wiki_ids, titles, provenance = [], [], [], []
        for k, out in enumerate(r.get("output") or []):
            if not isinstance(out, dict):
                raise InputError(f"output {k}: expected an object", field="output", **where)
            if isinstance(out.get("answer"), str):
                answers.append(out["answer"])
            elif out.get("answer") is not None:
                raise InputError(f"output {k}: expected a string answer", field="answer", **where)
            for prov in out.get("provenance") or []:
                if not isinstance(prov, dict) or not isinstance(prov.get("wikipedia_id"), str | int):
                    raise InputError(
                        f"output {k}: provenance without wikipedia_id", field="provenance", **where
                    )
                wiki_ids.append(str(prov["wikipedia_id"]))
                titles.append(prov.get("title") or "")
                provenance.append(prov)
        answers_t = _dedup(answers)
        if require_answers and not answers_t:
            raise InputError("no non-empty answer in any output", field="output", **where)
        examples.append(
            Example(
                id=r["id"],
                query=r["input"],
                answers=answers_t,
                task=task,
                supporting_ids=_dedup(wiki_ids),
                supporting_titles=_dedup(titles),
                meta={"provenance": provenance, **({"meta": r["meta"]} if "meta" in r else {})},
            )
        )
    return examples


# corag/multihopqa ----------------------------------------------------------------------------------

_MULTIHOPQA_REQUIRED = {"query": str, "answers": list, "query_id": str}
_MULTIHOPQA_OPTIONAL = {"context_doc_ids": list, "subqueries": list, "subanswers": list, "predictions": str}


def _multihopqa_example(r: dict[str, Any], where: dict[str, Any], task: str) -> Example:
    check_fields(r, _MULTIHOPQA_REQUIRED, _MULTIHOPQA_OPTIONAL, **_kw(where))
    answers = check_str_list(r["answers"], "answers", non_empty=True, **_kw(where))
    subqueries = check_str_list(r.get("subqueries") or [], "subqueries", **_kw(where))
    subanswers = check_str_list(r.get("subanswers") or [], "subanswers", **_kw(where))
    if len(subqueries) != len(subanswers):
        raise InputError(
            f"{len(subqueries)} subqueries but {len(subanswers)} subanswers", field="subanswers", **where
        )
    doc_ids = r.get("context_doc_ids") or []
    if not all(isinstance(d, str | int) and not isinstance(d, bool) for d in doc_ids):
        raise InputError("expected a list of document ids", field="context_doc_ids", **where)
    return Example(
        id=r["query_id"],
        query=r["query"],
        answers=_dedup(answers),
        task=task,
        decomposition=tuple(Step(q, a) for q, a in zip(subqueries, subanswers, strict=True)),
        meta={"context_doc_ids": [str(d) for d in doc_ids], "predictions": r.get("predictions")},
    )


def _multihopqa_task(name: str) -> str:
    for task in ("2wikimultihopqa", "hotpotqa", "musique", "bamboogle"):
        if task in name.lower():
            return task
    return "multihopqa"


def load_multihopqa(
    source: Any, *, task: str | None = None, errors: list[InputError] | None = None
) -> list[Example]:
    """The released `corag/multihopqa` schema (query, answers, query_id, context_doc_ids, subqueries,
    subanswers, predictions) from a JSONL or parquet file or a `datasets.Dataset`. The chain goes into
    `decomposition` (no per-step document ids: the release does not store them).

    With an `errors` list, invalid records (duplicate ids included) are skipped and their errors
    appended to it instead of raised."""
    if isinstance(source, str | Path):
        path = Path(source)
        task = task or _multihopqa_task(path.name)
        rows: Iterable[tuple[int | None, dict[str, Any]]]
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            rows = ((None, r) for r in pq.read_table(path).to_pylist())
        else:
            rows = iter_jsonl(path)
        file = str(path)
    else:  # a datasets.Dataset (or any iterable of dicts)
        task = task or "multihopqa"
        rows = ((None, r) for r in source)
        file = "<dataset>"
    ids, examples = UniqueIds(file), []
    for i, (line_no, r) in enumerate(rows):
        rid = _record_id(r, "query_id")
        where = {"file": file, "line": line_no, "record": rid if rid is not None else f"#{i}"}
        try:
            example = _multihopqa_example(r, where, task)
            ids.add(example.id, line_no, field="query_id")
        except InputError as error:
            if errors is None:
                raise
            errors.append(error)
            continue
        examples.append(example)
    return examples


# The project's plain JSONL -------------------------------------------------------------------------


def _plain_steps(value: Any, where: dict[str, Any]) -> tuple[Step, ...]:
    if not isinstance(value, list):
        raise InputError("expected a list of steps", field="decomposition", **where)
    steps = []
    for k, s in enumerate(value):
        if not isinstance(s, dict):
            raise InputError(f"step {k}: expected an object", field="decomposition", **where)
        check_fields(s, {"subquery": str, "subanswer": str}, {"doc_ids": list}, **_kw(where))
        doc_ids = check_str_list(s.get("doc_ids") or [], "decomposition.doc_ids", **_kw(where))
        steps.append(Step(s["subquery"], s["subanswer"], doc_ids))
    return tuple(steps)


def load_jsonl(
    path: PathLike, *, task: str | None = None, errors: list[InputError] | None = None
) -> list[Example]:
    """The project's own question JSONL: `id, query, answers` required; `task, supporting_ids,
    supporting_titles, decomposition [{subquery, subanswer, doc_ids}], meta` optional.

    With an `errors` list, invalid records (duplicate ids included) are skipped and their errors
    appended to it instead of raised."""
    path = Path(path)
    ids, examples = UniqueIds(path), []
    for line_no, r in iter_jsonl(path):
        where = {"file": str(path), "line": line_no, "record": _record_id(r, "id")}
        try:
            example = _plain_example(r, where, task)
            ids.add(example.id, line_no)
        except InputError as error:
            if errors is None:
                raise
            errors.append(error)
            continue
        examples.append(example)
    return examples


def _plain_example(r: dict[str, Any], where: dict[str, Any], task: str | None) -> Example:
    optional = {
        "task": str,
        "supporting_ids": list,
        "supporting_titles": list,
        "decomposition": list,
        "meta": dict,
    }
    check_fields(r, {"id": str, "query": str, "answers": list}, optional, **_kw(where))
    return Example(
        id=r["id"],
        query=r["query"],
        answers=check_str_list(r["answers"], "answers", non_empty=True, **_kw(where)),
        task=task or r.get("task") or "multihopqa",
        supporting_ids=check_str_list(r.get("supporting_ids") or [], "supporting_ids", **_kw(where)),
        supporting_titles=check_str_list(r.get("supporting_titles") or [], "supporting_titles", **_kw(where)),
        decomposition=_plain_steps(r.get("decomposition") or [], where),
        meta=r.get("meta") or {},
    )


def example_to_record(example: Example) -> dict[str, Any]:
    """An Example as one line of the project's plain JSONL (the inverse of `load_jsonl`)."""
    return {
        "id": example.id,
        "query": example.query,
        "answers": list(example.answers),
        "task": example.task,
        "supporting_ids": list(example.supporting_ids),
        "supporting_titles": list(example.supporting_titles),
        "decomposition": [
            {"subquery": s.subquery, "subanswer": s.subanswer, "doc_ids": list(s.doc_ids)}
            for s in example.decomposition
        ],
        "meta": dict(example.meta),
    }


# Dispatch ------------------------------------------------------------------------------------------

LOADERS: dict[str, Callable[..., list[Example]]] = {
    "jsonl": load_jsonl,
    "hotpotqa": load_hotpotqa,
    "2wiki": load_2wiki,
    "musique": load_musique,
    "bamboogle": load_bamboogle,
    "kilt": load_kilt,
    "multihopqa": load_multihopqa,
}


def _first_record_keys(path: Path) -> set[str]:
    for _, record in iter_jsonl(path):
        return set(record)
    return set()


def _input_file(source: PathLike) -> Path:
    """`source` as a Path to an existing file, or an InputError saying what it is instead."""
    path = Path(source)
    if path.is_dir():
        raise InputError("is a folder, not a file", file=str(path))
    if not path.is_file():
        raise InputError("no such file", file=str(path))
    return path


def detect_format(path: PathLike) -> str:
    """Guess the format from the file name and suffix (and, for a generic `.jsonl`, the keys of its
    first record). InputError when it cannot tell: pass `fmt` then."""
    path = _input_file(path)
    name, suffix = path.name.lower(), path.suffix.lower()
    if suffix == ".csv":
        return "bamboogle"
    if suffix == ".parquet":
        return "multihopqa"
    if suffix == ".jsonl" and "kilt" in name:
        return "kilt"
    if suffix == ".jsonl" and "musique" in name:
        return "musique"
    if suffix == ".json" and "hotpot" in name:
        return "hotpotqa"
    if suffix == ".json" and ("2wiki" in name or "wikimultihop" in name):
        return "2wiki"
    if suffix == ".jsonl":
        keys = _first_record_keys(path)
        if {"query_id", "query", "answers"} <= keys:
            return "multihopqa"
        if {"id", "query", "answers"} <= keys:
            return "jsonl"
        if {"id", "input", "output"} <= keys:
            return "kilt"
        if {"id", "question", "paragraphs"} <= keys:
            return "musique"
    raise InputError(
        f"cannot tell the format from the name; pass fmt= one of {sorted(LOADERS)}", file=str(path)
    )


def load_examples(source: Any, fmt: str | None = None, **kwargs: Any) -> list[Example]:
    """Load questions from `source` (a path, or a `datasets.Dataset` for "multihopqa") in format
    `fmt` ("jsonl", "hotpotqa", "2wiki", "musique", "bamboogle", "kilt", "multihopqa"), detected from
    the file name when not given. Extra keyword arguments go to that format's loader."""
    if not isinstance(source, str | Path):
        fmt = fmt or "multihopqa"
        if fmt != "multihopqa":
            raise InputError(f"only the multihopqa format loads from a dataset object, not {fmt!r}")
        return load_multihopqa(source, **kwargs)
    path = _input_file(source)
    fmt = fmt or detect_format(path)
    if fmt not in LOADERS:
        raise InputError(f"unknown format {fmt!r}; choose one of {sorted(LOADERS)}", file=str(path))
    if "errors" in kwargs and fmt not in ("jsonl", "multihopqa"):
        raise InputError(
            f"skipping invalid records works for jsonl and multihopqa, not {fmt!r}", file=str(path)
        )
    return LOADERS[fmt](path, **kwargs)
