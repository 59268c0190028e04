"""Loaders for the question files of each benchmark, in the formats they are published in.

Every loader returns `list[Example]` and raises InputError naming the file, line (or record index or
byte offset) or record id, and field for bad input. A file's format is told by the keys of its first
record, never by its name; its records may be a JSON array, JSON lines or a parquet file, whichever
the benchmark was published in or copied to (HotpotQA and 2Wiki as JSONL, MuSiQue as a JSON array).

Datasets that come with context paragraphs (HotpotQA, 2WikiMultihopQA, MuSiQue) keep them in
`meta["paragraphs"]` as `{"title", "text", "is_supporting"}` dicts, so that
`corag.data.corpus.corpus_from_contexts` can build a retrieval corpus and fill `supporting_ids`
(and MuSiQue's per-step `doc_ids`) with that corpus's ids. Loaders leave those ids empty, since their
meaning depends on which corpus is searched. KILT names its gold evidence by Wikipedia page:
those ids go to `supporting_pages`, never to `supporting_ids` (passage ids of a corpus).

Answers follow each benchmark's official script: 2Wiki's gold answers are the answer, its aliases
and its demonyms; MuSiQue's the answer and its aliases; both keep an empty alias (it matches an
answer that normalises to nothing, as there). KILT keeps the non-empty stripped answers. Test files
whose records carry no answers at all (KILT's `*-test_without_answers-kilt.jsonl`, a hub test split)
load with empty `answers`, for prediction and submission.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from corag.data.jsonl import (
    UniqueIds,
    check_fields,
    check_str_list,
    input_file,
    is_parquet,
    iter_jsonl,
    open_parquet,
)
from corag.errors import InputError
from corag.tasks import get_task, named_tasks
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


def _keep_empty(items: Iterable[str]) -> tuple[str, ...]:
    """Strip and drop repeats, keeping an empty string (an official alias like any other)."""
    return tuple(dict.fromkeys(item.strip() for item in items))


# Reading records ----------------------------------------------------------------------------------


class Row(NamedTuple):
    """One record and where it sits: its line (JSON lines) or None, and its index in the file."""

    line: int | None
    index: int
    record: dict[str, Any]


def _first_char(path: Path) -> str:
    """The first non-blank character of a text file ('' for a blank one)."""
    with path.open("rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head[:1].decode("ascii", errors="replace")


def _decode(data: bytes, path: Path) -> str:
    """A whole file as UTF-8 text; a bad byte is named by line, or by byte offset in a one-line file."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        one_line = data.count(b"\n", 0, len(data.rstrip(b"\r\n"))) == 0
        where = f"at byte offset {e.start}" if one_line else f"on line {line}"
        raise InputError(
            f"not UTF-8 text (byte 0x{data[e.start]:02x} {where})",
            file=str(path),
            line=None if one_line else line,
        ) from None


def _json_array(path: Path) -> list[Any]:
    """A whole-file JSON array; a syntax error is named by line, or by byte offset in a one-line file."""
    text = _decode(path.read_bytes(), path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        one_line = "\n" not in text.rstrip()
        at = "" if e.msg.endswith(" at") else " at"
        where = f"byte offset {len(text[: e.pos].encode('utf-8'))}" if one_line else f"column {e.colno}"
        cut = (
            "; the array is never closed: the file looks cut short" if not text.rstrip().endswith("]") else ""
        )
        raise InputError(
            f"malformed JSON ({e.msg}{at} {where}){cut}", file=str(path), line=None if one_line else e.lineno
        ) from None
    if not isinstance(data, list):
        raise InputError(f"expected a JSON array of records, got {type(data).__name__}", file=str(path))
    return data


def read_rows(path: PathLike) -> Iterator[Row]:
    """The records of a JSON array, a JSON-lines or a parquet file, whichever `path` holds."""
    path = Path(path)
    if _parquet(path):
        index = 0
        for batch in open_parquet(path).iter_batches():
            for record in batch.to_pylist():
                yield Row(None, index, record)
                index += 1
        return
    if _first_char(path) == "[":
        for index, record in enumerate(_json_array(path)):
            if not isinstance(record, dict):
                raise InputError(f"record #{index}: expected a JSON object", file=str(path))
            yield Row(None, index, record)
        return
    for index, (line, record) in enumerate(iter_jsonl(path)):
        yield Row(line, index, record)


def _where(path: PathLike, row: Row, id_key: str) -> dict[str, Any]:
    """file / line / record of a row: its id when it has a usable one, else its index."""
    rid = row.record.get(id_key)
    if isinstance(rid, int) and not isinstance(rid, bool):
        rid = str(rid)
    return {"file": str(path), "line": row.line, "record": rid if isinstance(rid, str) else f"#{row.index}"}


def _kw(where: dict[str, Any]) -> dict[str, Any]:
    """`where` (file/line/record) spelled as check_fields keyword arguments."""
    return {"file": where.get("file"), "line": where.get("line"), "record_id": where.get("record")}


def _task_name(
    path: PathLike | None,
    given: str | None,
    own: Any = None,
    *,
    default: str | None = None,
    kilt: bool = False,
    where: dict[str, Any] | None = None,
) -> str:
    """A record's task: `given` (the command's `--task`), else the record's own `task` field, else the
    format's (`default`), else the file's name (in KILT's namespace with `kilt`: the records are KILT's);
    else, or where the name could mean two tasks, an InputError asking for `--task`."""
    if given:
        return get_task(given, kilt=kilt, field="--task").name
    where = where or {"file": None if path is None else str(path)}
    if isinstance(own, str) and own.strip():
        return get_task(own, kilt=kilt, **where).name
    if default:
        return default
    named = named_tasks(path, kilt=kilt) if path is not None else ()
    if len(named) == 1:
        return named[0]
    if named:
        raise InputError(
            f"the file name could mean {' or '.join(named)}, scored by different rules, and the records "
            f"carry no task; pass --task {' or --task '.join(named)}",
            field="task",
            **where,
        )
    raise InputError(
        "cannot tell the task from the records or the file name; pass --task (e.g. hotpotqa, nq, "
        "kilt_hotpotqa; `corag.tasks` lists them)",
        field="task",
        **where,
    )


def _check_answered(examples: list[tuple[dict[str, Any], Example]], field: str) -> list[Example]:
    """Gold files answer every question; a test file answers none. A file that answers some but not
    all has a broken record: the first unanswered one is the error."""
    answered = sum(bool(e.answers) for _, e in examples)
    if 0 < answered < len(examples):
        where, _ = next((w, e) for w, e in examples if not e.answers)
        raise InputError("no non-empty answer, where the file's other records have one", field=field, **where)
    return [e for _, e in examples]


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


def _wiki_rows(path: Path, optional: dict[str, type]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(where, record) of HotpotQA- or 2Wiki-shaped records, checked, ids unique."""
    ids = UniqueIds(path)
    required = {"_id": str, "question": str, "answer": str, "supporting_facts": list}
    for row in read_rows(path):
        where = _where(path, row, "_id")
        check_fields(row.record, required, optional, **_kw(where))
        ids.add(row.record["_id"], row.line, field="_id")
        if not row.record["answer"].strip():
            raise InputError("empty answer", field="answer", **where)
        yield where, row.record


def load_hotpotqa(
    path: PathLike, *, task: str | None = None, keep_context: bool = True, **_: Any
) -> list[Example]:
    """HotpotQA (distractor or fullwiki), as the published JSON array or as JSON lines: `_id,
    question, answer, supporting_facts, context, type, level`."""
    path = Path(path)
    task_name = _task_name(path, task, default="hotpotqa")
    examples = []
    for where, r in _wiki_rows(path, {"context": list, "type": str, "level": str}):
        titles = _supporting_titles(r["supporting_facts"], where)
        meta: dict[str, Any] = {"type": r.get("type"), "level": r.get("level")}
        if keep_context and "context" in r:
            meta["paragraphs"] = _context_paragraphs(r["context"], set(titles), "", where)
        examples.append(
            Example(
                id=r["_id"],
                query=r["question"].strip(),
                answers=(r["answer"].strip(),),
                task=task_name,
                supporting_titles=titles,
                meta=meta,
            )
        )
    return examples


def read_2wiki_aliases(path: PathLike) -> dict[str, tuple[str, ...]]:
    """2WikiMultihopQA's `id_aliases.json`, as the official script reads it: JSON lines `{"Q_id",
    "aliases", "demonyms"}`, each answer id's gold strings being its aliases and its demonyms (empty
    strings kept). A single JSON object mapping answer id -> list of aliases is read too."""
    path = input_file(path)
    try:
        whole = json.loads(_decode(path.read_bytes(), path))
    except json.JSONDecodeError:
        whole = None  # JSON lines: one object per line
    if isinstance(whole, dict) and "Q_id" not in whole:
        return {k: check_str_list(v, "aliases", file=path, record_id=k) for k, v in whole.items()}
    aliases: dict[str, tuple[str, ...]] = {}
    for line_no, r in iter_jsonl(path):
        check_fields(r, {"Q_id": str, "aliases": list}, {"demonyms": list}, file=path, line=line_no)
        where = {"file": path, "line": line_no, "record_id": r["Q_id"]}
        names = check_str_list(r["aliases"], "aliases", **where)
        demonyms = check_str_list(r.get("demonyms") or [], "demonyms", **where)
        aliases[r["Q_id"]] = (*names, *demonyms)
    if not aliases:
        raise InputError("no aliases in the file", file=str(path))
    return aliases


def load_2wiki(
    path: PathLike,
    *,
    aliases: PathLike | Mapping[str, tuple[str, ...]] | None = None,
    task: str | None = None,
    keep_context: bool = True,
    **_: Any,
) -> list[Example]:
    """2WikiMultihopQA, as the published JSON array or as JSON lines: `_id, type, question, context,
    supporting_facts, evidences, answer` and, in the id-enhanced release, `answer_id`. With `aliases`
    (an id_aliases.json path or a mapping) the answer id's aliases and demonyms become further gold
    answers, as the official evaluation adds them."""
    path = Path(path)
    alias_map = read_2wiki_aliases(aliases) if isinstance(aliases, str | Path) else (aliases or {})
    task_name = _task_name(path, task, default="2wikimultihopqa")
    optional = {"context": list, "type": str, "evidences": list, "answer_id": str, "entity_ids": str}
    examples = []
    for where, r in _wiki_rows(path, optional):
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
                answers=_keep_empty([r["answer"], *alias_map.get(answer_id or "", ())]),
                task=task_name,
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
    for j, p in enumerate(r.get("paragraphs") or []):
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


def _musique_steps(r: dict[str, Any], where: dict[str, Any]) -> tuple[Step, ...]:
    steps, sub_answers = [], []
    for k, d in enumerate(r.get("question_decomposition") or []):
        if not isinstance(d, dict):
            raise InputError(f"step {k}: expected an object", field="question_decomposition", **where)
        check_fields(d, {"question": str, "answer": str}, {"paragraph_support_idx": int}, **_kw(where))
        steps.append(Step(subquery=_resolve_refs(d["question"], sub_answers).strip(), subanswer=d["answer"]))
        sub_answers.append(d["answer"])
    return tuple(steps)


def load_musique(
    path: PathLike,
    *,
    task: str | None = None,
    answerable_only: bool = True,
    keep_context: bool = True,
    **_: Any,
) -> list[Example]:
    """MuSiQue (`musique_ans` or `musique_full`), as the published JSON lines or as a JSON array, with
    or without `paragraphs` (question-only copies serve open-domain runs): gold answers are `answer`
    plus `answer_aliases`; the gold chain comes from `question_decomposition` with `#k` references
    filled in (the raw sub-questions and supporting paragraph indices stay in
    `meta["question_decomposition"]`). Unanswerable records of MuSiQue-Full are skipped unless
    `answerable_only=False`."""
    path = Path(path)
    task_name = _task_name(path, task, default="musique")
    ids, examples = UniqueIds(path), []
    required = {"id": str, "question": str, "answer": str}
    optional = dict.fromkeys(("answer_aliases", "question_decomposition", "paragraphs"), list)
    for row in read_rows(path):
        r, where = row.record, _where(path, row, "id")
        check_fields(r, required, {**optional, "answerable": bool}, **_kw(where))
        ids.add(r["id"], row.line)
        answerable = r.get("answerable", True)
        if answerable_only and not answerable:
            continue
        aliases = check_str_list(r.get("answer_aliases") or [], "answer_aliases", **_kw(where))
        if answerable and not r["answer"].strip():
            raise InputError("empty answer", field="answer", **where)
        if "paragraphs" in r and r["paragraphs"] is None:
            raise InputError("null; a question-only copy leaves the key out", field="paragraphs", **where)
        paragraphs = _musique_paragraphs(r, where)
        meta: dict[str, Any] = {
            "answerable": answerable,
            "question_decomposition": r.get("question_decomposition") or [],
        }
        if keep_context and "paragraphs" in r:
            meta["paragraphs"] = paragraphs
        examples.append(
            Example(
                id=r["id"],
                query=r["question"].strip(),
                answers=_keep_empty([r["answer"], *aliases]),
                task=task_name,
                supporting_titles=_musique_supporting_titles(
                    paragraphs, r.get("question_decomposition") or []
                ),
                decomposition=_musique_steps(r, where),
                meta=meta,
            )
        )
    return examples


# Bamboogle -----------------------------------------------------------------------------------------


def load_bamboogle(path: PathLike, *, task: str | None = None, **_: Any) -> list[Example]:
    """Bamboogle CSV without a header: question in column 0, answer in column 4, an alternative
    answer in column 5 when present. Ids are `bamboogle-<row>` (0-based row of the CSV). Every row
    has as many columns as the first (7 in the published file): a shorter row, or a quote left open
    at the end, is a file cut short, never a shorter answer."""
    path = Path(path)
    task_name = _task_name(path, task, default="bamboogle")
    text = _decode(path.read_bytes(), path)
    examples, width = [], None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    row_no = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            raise InputError(
                f"malformed CSV ({e}): the file looks cut short", file=str(path), line=reader.line_num
            ) from None
        row_no += 1
        if not any(cell.strip() for cell in row):
            continue
        rid = f"bamboogle-{row_no - 1}"
        where = {"file": str(path), "line": reader.line_num, "record": rid}
        width = width or len(row)
        if len(row) != width:
            raise InputError(
                f"{len(row)} columns where the first row has {width}: the file looks cut short",
                field=f"column {len(row) - 1}",
                **where,
            )
        if len(row) < 5:
            raise InputError(f"expected at least 5 columns, got {len(row)}", field="column 4", **where)
        question = row[0].strip()
        if not question:
            raise InputError("empty question", field="column 0", **where)
        answers = _dedup([row[4], *(row[5:6])])
        if not answers:
            raise InputError("empty answer", field="column 4", **where)
        examples.append(Example(id=rid, query=question, answers=answers, task=task_name))
    return examples


# KILT ----------------------------------------------------------------------------------------------


class _KiltOutputs(NamedTuple):
    answers: list[str]
    titles: list[str]
    provenance: list[Any]
    evidence: list[list[str]]  # the page ids of each output that has provenance (KILT's evidence sets)


def _kilt_outputs(r: dict[str, Any], where: dict[str, Any]) -> _KiltOutputs:
    """Answers, provenance titles, provenance entries and evidence sets of a KILT record's outputs."""
    found = _KiltOutputs([], [], [], [])
    for k, out in enumerate(r.get("output") or []):
        if not isinstance(out, dict):
            raise InputError(f"output {k}: expected an object", field="output", **where)
        if isinstance(out.get("answer"), str):
            found.answers.append(out["answer"])
        elif out.get("answer") is not None:
            raise InputError(f"output {k}: expected a string answer", field="answer", **where)
        if "provenance" not in out:
            continue
        pages = []
        for prov in out.get("provenance") or []:
            page = prov.get("wikipedia_id") if isinstance(prov, dict) else None
            if isinstance(page, bool) or not isinstance(page, str | int):
                raise InputError(f"output {k}: provenance without wikipedia_id", field="provenance", **where)
            pages.append(str(page).strip())
            found.titles.append(prov.get("title") or "")
            found.provenance.append(prov)
        found.evidence.append(pages)
    return found


def load_kilt(
    path: PathLike, *, task: str | None = None, require_answers: bool | None = None, **_: Any
) -> list[Example]:
    """A KILT task file (any task; JSON lines or parquet): `id, input, output [{answer, provenance
    [{wikipedia_id, title}]}]`.

    Answers are the non-empty stripped `answer` strings of all outputs (some outputs only carry
    provenance); `supporting_pages` are the provenance Wikipedia page ids, `supporting_titles` their
    titles, and `meta["evidence"]` the page ids of each output's provenance (KILT's evidence sets).
    A test file (no record answered) loads with empty answers; `require_answers=True`
    refuses it, `False` accepts any record without answers.
    """
    path = Path(path)
    ids, rows = UniqueIds(path), []
    for row in read_rows(path):
        r, where = row.record, _where(path, row, "id")
        if isinstance(r.get("id"), int) and not isinstance(r["id"], bool):
            r = {**r, "id": str(r["id"])}  # some KILT files (e.g. zsRE) use integer ids
        check_fields(r, {"id": str, "input": str}, {"output": list, "task": str}, **_kw(where))
        ids.add(r["id"], row.line)
        outputs = _kilt_outputs(r, where)
        answers_t = _dedup(outputs.answers)
        if require_answers and not answers_t:
            raise InputError("no non-empty answer in any output", field="output", **where)
        meta = {"provenance": outputs.provenance, "evidence": outputs.evidence}
        example = Example(
            id=r["id"],
            query=r["input"],
            answers=answers_t,
            task=_task_name(path, task, r.get("task"), kilt=True, where=where),
            supporting_pages=_dedup(p for pages in outputs.evidence for p in pages),
            supporting_titles=_dedup(outputs.titles),
            meta={**meta, **({"meta": r["meta"]} if "meta" in r else {})},
        )
        rows.append((where, example))
    return [e for _, e in rows] if require_answers is False else _check_answered(rows, "output")


# corag/multihopqa (and the hub's corag/kilt splits) -------------------------------------------------

_MULTIHOPQA_REQUIRED = {"query": str, "answers": list, "query_id": str}
_MULTIHOPQA_OPTIONAL = {
    "context_doc_ids": list,
    "subqueries": list,
    "subanswers": list,
    "predictions": str,
    "task": str,
    "task_desc": str,
}


def _multihopqa_example(
    r: dict[str, Any], where: dict[str, Any], path: Path | None, task: str | None
) -> Example:
    check_fields(r, _MULTIHOPQA_REQUIRED, _MULTIHOPQA_OPTIONAL, **_kw(where))
    answers = check_str_list(r["answers"], "answers", **_kw(where))
    if answers and not any(a.strip() for a in answers):
        raise InputError("must hold at least one non-empty string", field="answers", **where)
    subqueries = check_str_list(r.get("subqueries") or [], "subqueries", **_kw(where))
    subanswers = check_str_list(r.get("subanswers") or [], "subanswers", **_kw(where))
    if len(subqueries) != len(subanswers):
        raise InputError(
            f"{len(subqueries)} subqueries but {len(subanswers)} subanswers", field="subanswers", **where
        )
    doc_ids = r.get("context_doc_ids") or []
    if not all(isinstance(d, str | int) and not isinstance(d, bool) for d in doc_ids):
        raise InputError("expected a list of document ids", field="context_doc_ids", **where)
    meta: dict[str, Any] = {"context_doc_ids": [str(d) for d in doc_ids], "predictions": r.get("predictions")}
    if r.get("task_desc"):
        meta["task_desc"] = r["task_desc"]
    return Example(
        id=r["query_id"],
        query=r["query"],
        answers=_keep_empty(answers),
        task=_task_name(path, task, r.get("task"), where=where),
        decomposition=tuple(Step(q, a) for q, a in zip(subqueries, subanswers, strict=True)),
        meta=meta,
    )


def load_multihopqa(
    source: Any, *, task: str | None = None, errors: list[InputError] | None = None, **_: Any
) -> list[Example]:
    """The released `corag/multihopqa` schema (query, answers, query_id, context_doc_ids, subqueries,
    subanswers, predictions; also the hub's `corag/kilt` splits) from a JSON-lines or parquet file or
    a `datasets.Dataset`. The chain goes into `decomposition` (no per-step document ids: the release
    does not store them); a record's own `task` and `task_desc` are kept. A test split whose records
    all have empty `answers` loads for prediction.

    With an `errors` list, invalid records (duplicate ids included) are skipped and their errors
    appended to it instead of raised."""
    path: Path | None
    if isinstance(source, str | Path):
        path = Path(source)
        rows: Iterable[Row] = read_rows(path)
        file = str(path)
    else:  # a datasets.Dataset (or any iterable of dicts)
        path, file = None, "<dataset>"
        rows = (Row(None, i, r) for i, r in enumerate(source))
    ids, examples = UniqueIds(file), []
    for row in rows:
        where = _where(file, row, "query_id")
        try:
            example = _multihopqa_example(row.record, where, path, task)
            ids.add(example.id, row.line, field="query_id")
        except InputError as error:
            if errors is None:
                raise
            errors.append(error)
            continue
        examples.append((where, example))
    return _check_answered(examples, "answers")


# FlashRAG (the question files of the Search-R1 suite) -----------------------------------------------

_FLASHRAG_REQUIRED = {"id": str, "question": str, "golden_answers": list}
# FlashRAG_datasets publishes each set as `<dataset>/<split>.jsonl` (nq/test.jsonl, popqa/test.jsonl, ...)
_FLASHRAG_SPLITS = ("train.jsonl", "dev.jsonl", "test.jsonl")


def _flashrag_task(path: Path, task: str | None, own: Any, where: dict[str, Any]) -> str:
    """A FlashRAG record's task: `--task`, the record's own `task` (`corag prepare-data` writes one), the
    file's name (`hotpotqa_dev.jsonl`), else the dataset folder of FlashRAG's layout (`nq/test.jsonl`)."""
    if task or (isinstance(own, str) and own.strip()) or named_tasks(path):
        return _task_name(path, task, own, where=where)
    if path.name in _FLASHRAG_SPLITS:
        try:
            return get_task(path.parent.name).name
        except InputError:
            pass
    return _task_name(path, None, where=where)  # asks for --task


def load_flashrag(path: PathLike, *, task: str | None = None, **_: Any) -> list[Example]:
    """FlashRAG's question files (RUC-NLPIR/FlashRAG_datasets, read by Search-R1's data scripts): JSON
    lines of `id, question, golden_answers`, with an optional `metadata` object kept in `meta`. The
    files carry no task: it comes from `--task`, a `task` field, the file's name or its dataset folder
    (`nq/test.jsonl` is NQ, `popqa/test.jsonl` PopQA). Gold answers are kept as published, empty ones
    too (Search-R1 scores them: an empty prediction matches an empty answer); a record with none gets
    no answer metrics, as a test question."""
    path = Path(path)
    ids, examples = UniqueIds(path), []
    for row in read_rows(path):
        r, where = row.record, _where(path, row, "id")
        check_fields(r, _FLASHRAG_REQUIRED, {"metadata": dict, "task": str}, **_kw(where))
        answers = check_str_list(r["golden_answers"], "golden_answers", **_kw(where))
        ids.add(r["id"], row.line)
        meta = {"metadata": r["metadata"]} if r.get("metadata") else {}
        task_name = _flashrag_task(path, task, r.get("task"), where)
        # empty answers kept, as Search-R1's em_check keeps them (an empty prediction matches one)
        examples.append(
            Example(id=r["id"], query=r["question"], answers=_keep_empty(answers), task=task_name, meta=meta)
        )
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
    path: PathLike, *, task: str | None = None, errors: list[InputError] | None = None, **_: Any
) -> list[Example]:
    """The project's own question JSONL: `id, query, answers` required; `task, supporting_ids,
    supporting_pages, supporting_titles, decomposition [{subquery, subanswer, doc_ids}], meta` optional.

    With an `errors` list, invalid records (duplicate ids included) are skipped and their errors
    appended to it instead of raised."""
    path = Path(path)
    ids, examples = UniqueIds(path), []
    for row in read_rows(path):
        where = _where(path, row, "id")
        try:
            example = _plain_example(row.record, where, path, task)
            ids.add(example.id, row.line)
        except InputError as error:
            if errors is None:
                raise
            errors.append(error)
            continue
        examples.append(example)
    return examples


def _plain_example(r: dict[str, Any], where: dict[str, Any], path: Path, task: str | None) -> Example:
    optional = {
        "task": str,
        "supporting_ids": list,
        "supporting_pages": list,
        "supporting_titles": list,
        "decomposition": list,
        "meta": dict,
    }
    check_fields(r, {"id": str, "query": str, "answers": list}, optional, **_kw(where))
    lists = {
        name: check_str_list(r.get(name) or [], name, **_kw(where))
        for name in ("supporting_ids", "supporting_pages", "supporting_titles")
    }
    return Example(
        id=r["id"],
        query=r["query"],
        answers=check_str_list(r["answers"], "answers", non_empty=True, **_kw(where)),
        task=_task_name(path, task, r.get("task"), where=where),
        decomposition=_plain_steps(r.get("decomposition") or [], where),
        meta=r.get("meta") or {},
        **lists,
    )


def example_to_record(example: Example) -> dict[str, Any]:
    """An Example as one line of the project's plain JSONL (the inverse of `load_jsonl`)."""
    return {
        "id": example.id,
        "query": example.query,
        "answers": list(example.answers),
        "task": example.task,
        "supporting_ids": list(example.supporting_ids),
        "supporting_pages": list(example.supporting_pages),
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
    "flashrag": load_flashrag,
}


# Where each format keeps the question (for messages).
QUESTION_FIELD = {
    "jsonl": "query",
    "multihopqa": "query",
    "kilt": "input",
    "bamboogle": "column 0",
    "flashrag": "question",
}


def _first_keys(path: Path) -> set[str]:
    """The keys of a file's first record (the column names of a parquet file)."""
    if _parquet(path):
        return set(open_parquet(path).schema_arrow.names)
    first = next(read_rows(path), None)
    return set(first.record) if first else set()


def format_of_keys(keys: set[str]) -> str | None:
    """The format whose records have these keys, or None."""
    if {"query_id", "query", "answers"} <= keys:
        return "multihopqa"
    if {"id", "query", "answers"} <= keys:
        return "jsonl"
    if {"id", "input"} <= keys:
        return "kilt"
    if {"id", "question", "golden_answers"} <= keys:
        return "flashrag"
    if {"id", "question", "answer"} <= keys:
        return "musique"
    if {"_id", "question", "answer"} <= keys:
        wiki2 = {"evidences", "answer_id", "entity_ids", "evidences_id"}
        return "2wiki" if keys & wiki2 else "hotpotqa"
    return None


def _parquet(path: Path) -> bool:
    """Parquet by its bytes; a file named .parquet that is not is refused rather than read as text."""
    if is_parquet(path):
        return True
    if path.suffix.lower() == ".parquet":
        open_parquet(path)  # raises, naming the file
    return False


def _sentences_unspaced(path: Path) -> bool:
    """Whether the first records' paragraphs join their sentences with no leading space, as
    2WikiMultihopQA's do (HotpotQA's sentences after the first start with one)."""
    seen = 0
    for row in itertools.islice(read_rows(path), 5):
        for paragraph in row.record.get("context") or []:
            sentences = paragraph[1] if isinstance(paragraph, list) and len(paragraph) == 2 else []
            for sentence in sentences[1:]:
                if isinstance(sentence, str) and sentence[:1].isspace():
                    return False
                seen += 1
    return seen > 0


def detect_format(path: PathLike) -> str:
    """The format of a question file, told by its content: the keys of its first record, and for a
    HotpotQA-shaped file without 2Wiki's own keys, how its sentences join. The suffix is a hint only:
    a `.csv` that does not start as JSON is Bamboogle (a CSV without a header). InputError when no
    format has those keys: pass `fmt` then."""
    path = input_file(path)
    if path.suffix.lower() == ".csv" and _first_char(path) not in "[{":
        return "bamboogle"
    keys = _first_keys(path)
    if not keys:
        raise InputError("no records in the file", file=str(path))
    fmt = format_of_keys(keys)
    if fmt == "hotpotqa" and _sentences_unspaced(path):
        fmt = "2wiki"
    if fmt is None:
        raise InputError(
            f"no known format has the keys {sorted(keys)[:8]} of the first record; pass --format one "
            f"of {sorted(LOADERS)}",
            file=str(path),
        )
    return fmt


def load_examples(source: Any, fmt: str | None = None, **kwargs: Any) -> list[Example]:
    """Load questions from `source` (a path, or a `datasets.Dataset` for "multihopqa") in format
    `fmt` ("jsonl", "hotpotqa", "2wiki", "musique", "bamboogle", "kilt", "multihopqa", "flashrag"),
    detected from the keys of its records when not given. Keyword arguments go to the loaders (`task` to every one,
    `aliases` to 2Wiki's, `errors` to jsonl's and multihopqa's). A file without questions is an error."""
    if not isinstance(source, str | Path):
        fmt = fmt or "multihopqa"
        if fmt != "multihopqa":
            raise InputError(f"only the multihopqa format loads from a dataset object, not {fmt!r}")
        return load_multihopqa(source, **kwargs)
    path = input_file(source)
    fmt = fmt or detect_format(path)
    if fmt not in LOADERS:
        raise InputError(f"unknown format {fmt!r}; choose one of {sorted(LOADERS)}", file=str(path))
    if "errors" in kwargs and fmt not in ("jsonl", "multihopqa"):
        raise InputError(
            f"skipping invalid records works for jsonl and multihopqa, not {fmt!r}", file=str(path)
        )
    if kwargs.get("aliases") and fmt != "2wiki":
        raise InputError(f"an alias file is for 2WikiMultihopQA questions, not {fmt!r}", file=str(path))
    examples = LOADERS[fmt](path, **kwargs)
    if not examples and not kwargs.get("errors"):
        raise InputError("no questions in the file", file=str(path))
    blank = next((e for e in examples if not e.query.strip()), None)
    if blank is not None:
        raise InputError(
            "empty question", file=str(path), record=blank.id, field=QUESTION_FIELD.get(fmt, "question")
        )
    return examples
