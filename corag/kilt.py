"""KILT submissions: write them, check them against a gold file, and score them as KILT does.

A submission line is `{"id": ..., "output": [{"answer": "...", "provenance": [{"wikipedia_id": "..."}]}]}`.
Scoring follows kilt/eval_downstream.py and kilt/eval_retrieval.py: per record, strict accuracy, EM,
F1 and ROUGE-L against the gold answers; the KILT variants count a record only when the page-level
R-precision of its provenance is 1; retrieval reports R-precision, recall@k and precision@k over
Wikipedia ids. An empty answer scores 0 everywhere (retrieval still counts), as there.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corag.data.jsonl import atomic_write, input_file, iter_jsonl
from corag.errors import InputError
from corag.metrics import kilt_answer_scores, kilt_precision_at_k, kilt_recall_at_k, r_precision


@dataclass(frozen=True)
class KiltPrediction:
    """One answer with the Wikipedia ids of the pages it rests on, best first."""

    id: str
    answer: str
    wikipedia_ids: tuple[str, ...] = ()


def submission_record(prediction: KiltPrediction) -> dict[str, Any]:
    """The KILT line for a prediction; repeated page ids (several passages of a page) are kept once."""
    pages = list(dict.fromkeys(prediction.wikipedia_ids))
    provenance = [{"wikipedia_id": page} for page in pages]
    return {"id": prediction.id, "output": [{"answer": prediction.answer, "provenance": provenance}]}


def write_submission(path: str | Path, predictions: Iterable[KiltPrediction]) -> int:
    """Write a submission JSONL atomically (temp file, then rename); returns the number of lines."""
    path = Path(path)
    lines, seen = [], set()
    for index, pred in enumerate(predictions):
        where = {"file": str(path), "record": str(pred.id)}
        if not isinstance(pred.id, str) or not pred.id.strip():
            raise InputError(f"prediction {index} needs a non-empty string id", **where, field="id")
        if pred.id in seen:
            raise InputError("duplicate id", **where, field="id")
        if not isinstance(pred.answer, str):
            raise InputError("answer must be a string", **where, field="answer")
        if not all(isinstance(page, str) for page in pred.wikipedia_ids):
            raise InputError("wikipedia ids must be strings", **where, field="wikipedia_id")
        seen.add(pred.id)
        lines.append(json.dumps(submission_record(pred), ensure_ascii=False))
    with atomic_write(path) as f:
        f.write("".join(line + "\n" for line in lines))
    return len(lines)


def _record_id(obj: dict[str, Any], path: str, line: int) -> str:
    raw = obj.get("id")
    if isinstance(raw, bool) or not isinstance(raw, (str, int)) or not str(raw).strip():
        raise InputError("missing or invalid id (a string or integer)", file=path, line=line, field="id")
    return str(raw).strip()


def _check_provenance(output: dict[str, Any], where: dict[str, Any]) -> None:
    if "provenance" not in output:
        return
    provenance = output["provenance"]
    if not isinstance(provenance, list):
        raise InputError("provenance must be a list", **where, field="provenance")
    for item in provenance:
        page = item.get("wikipedia_id") if isinstance(item, dict) else None
        if isinstance(page, bool) or not isinstance(page, (str, int)):
            raise InputError(
                "each provenance entry needs a wikipedia_id (string)", **where, field="wikipedia_id"
            )


def _check_outputs(obj: dict[str, Any], where: dict[str, Any], *, single: bool) -> None:
    outputs = obj.get("output")
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise InputError("output must be a list of objects", **where, field="output")
    if single and len(outputs) != 1:
        raise InputError(
            f"a submission needs exactly one output, found {len(outputs)}", **where, field="output"
        )
    for output in outputs:
        if single and "answer" not in output:
            raise InputError("the output has no answer", **where, field="answer")
        if "answer" in output and not isinstance(output["answer"], str):
            raise InputError("answer must be a string", **where, field="answer")
        _check_provenance(output, where)


def _index(
    records: list[tuple[int, dict[str, Any]]], path: str, *, single: bool
) -> dict[str, dict[str, Any]]:
    """Records by stripped id, structure checked; a repeated id is an error."""
    by_id: dict[str, dict[str, Any]] = {}
    for line, obj in records:
        record_id = _record_id(obj, path, line)
        where = {"file": path, "line": line, "record": record_id}
        if record_id in by_id:
            raise InputError("duplicate id", **where, field="id")
        _check_outputs(obj, where, single=single)
        by_id[record_id] = obj
    return by_id


def load_gold(path: str | Path) -> dict[str, dict[str, Any]]:
    """A KILT gold file by id (file order kept), structure checked."""
    return _index(list(iter_jsonl(input_file(path))), str(path), single=False)


def validate_submission(
    submission: str | Path, gold: str | Path, *, allow_extra: bool = False, require_all: bool = True
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Check a submission against a gold file; returns (gold, guess) pairs in gold order.

    Every line needs one output holding a string answer. A gold id without a line is an error with
    `require_all` (as KILT's own script); without it, it counts 0 (an empty answer, no provenance)
    and a warning says how many. Ids not in the gold file are an error unless `allow_extra` (then
    they are left out, and a count is printed).
    """
    gold_by_id = load_gold(gold)
    guess_by_id = _index(list(iter_jsonl(input_file(submission))), str(submission), single=True)
    missing = [record_id for record_id in gold_by_id if record_id not in guess_by_id]
    check_missing(missing, len(gold_by_id), str(submission), "id", require_all, what="gold id(s)")
    for record_id in missing:
        guess_by_id[record_id] = {"id": record_id, "output": [{"answer": "", "provenance": []}]}
    extra = [record_id for record_id in guess_by_id if record_id not in gold_by_id]
    if extra and not allow_extra:
        raise InputError(
            f"{len(extra)} id(s) not in the gold file {gold}, first {extra[0]!r}",
            file=str(submission),
            record=extra[0],
            field="id",
        )
    if extra:
        print(f"left out {len(extra)} submission id(s) not in the gold file", file=sys.stderr)
    return [(gold_by_id[record_id], guess_by_id[record_id]) for record_id in gold_by_id]


def gold_answers(gold: dict[str, Any]) -> list[str]:
    """The distinct non-empty stripped answers of a gold record, in file order."""
    answers = [o["answer"].strip() for o in gold["output"] if isinstance(o.get("answer"), str)]
    return list(dict.fromkeys(answer for answer in answers if answer))


def provenance_sets(record: dict[str, Any]) -> list[list[str]]:
    """The Wikipedia ids of each output that has provenance (one evidence set per output)."""
    return [
        [str(p["wikipedia_id"]).strip() for p in output["provenance"]]
        for output in record["output"]
        if "provenance" in output
    ]


def score_record(gold: dict[str, Any], guess: dict[str, Any], ks: Sequence[int] = (1, 5)) -> dict[str, float]:
    """KILT's per-record numbers: downstream, KILT variants and retrieval, each in [0, 1]."""
    answers = gold_answers(gold)
    if not answers:
        raise InputError("gold record has no answer", record=str(gold["id"]), field="answer")
    guess_pages = [page for pages in provenance_sets(guess)[:1] for page in pages]
    gold_sets = provenance_sets(gold)
    rprec = r_precision(guess_pages, gold_sets)
    row = {"Rprec": rprec}
    for k in ks:
        row[f"recall@{k}"] = kilt_recall_at_k(guess_pages, gold_sets, k)
        row[f"precision@{k}"] = kilt_precision_at_k(guess_pages, gold_sets, k)
    downstream = kilt_answer_scores(guess["output"][0]["answer"], answers)
    row.update(downstream)
    for name, value in downstream.items():
        row[f"KILT-{name}"] = value if rprec == 1 else 0.0
    return row


def score_pairs(pairs: Sequence[tuple[dict[str, Any], dict[str, Any]]], ks: Sequence[int] = (1, 5)) -> dict:
    """Mean KILT scores over aligned (gold, guess) pairs, grouped as KILT reports them."""
    rows = [score_record(gold, guess, ks) for gold, guess in pairs]
    mean = {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]} if rows else {}
    retrieval_keys = ["Rprec"] + [f"{m}@{k}" for k in ks for m in ("recall", "precision")]
    downstream_keys = ["accuracy", "em", "f1", "rougel"]
    return {
        "downstream": {key: mean.get(key, 0.0) for key in downstream_keys},
        "kilt": {f"KILT-{key}": mean.get(f"KILT-{key}", 0.0) for key in downstream_keys},
        "retrieval": {key: mean.get(key, 0.0) for key in retrieval_keys},
        "count": len(rows),
    }


def check_missing(
    missing: list[str], total: int, source: str, field: str, require_all: bool, what: str = "question(s)"
) -> None:
    """Questions without a prediction: refused under --require-all, else one warning (each counts 0)."""
    if not missing:
        return
    if require_all:
        raise InputError(
            f"no prediction for {len(missing)} {what}, first {missing[0]!r}",
            file=source,
            record=missing[0],
            field=field,
        )
    print(
        f"warning: {source}: no prediction for {len(missing)} of {total} question(s) (first {missing[0]!r}); "
        "each counts 0 (--require-all refuses instead)",
        file=sys.stderr,
    )


def score_submission(
    submission: str | Path,
    gold: str | Path,
    *,
    ks: Sequence[int] = (1, 5),
    allow_extra: bool = False,
    require_all: bool = True,
) -> dict:
    """Validate a submission against a gold KILT file and score it (see `score_pairs`)."""
    pairs = validate_submission(submission, gold, allow_extra=allow_extra, require_all=require_all)
    return score_pairs(pairs, ks)


# Wikipedia page ids of retrieved passages --------------------------------------------------------------


def read_page_ids(path: str | Path) -> dict[str, str]:
    """A map from page title to Wikipedia page id: a JSON object (`corag kilt-pages` writes one)."""
    path = input_file(path)
    try:
        mapping = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"not a JSON object of title -> page id ({err})", file=str(path)) from None
    if not isinstance(mapping, dict):
        raise InputError(
            f"expected a JSON object of title -> page id, got {type(mapping).__name__}", file=str(path)
        )
    for title, page in mapping.items():
        if isinstance(page, bool) or not isinstance(page, str | int):
            raise InputError(
                f"expected a page id, got {page!r:.40}", file=str(path), record=title, field="wikipedia_id"
            )
    return {title: str(page) for title, page in mapping.items()}


def passage_pages(passages: Iterable[Any], title_ids: dict[str, str]) -> tuple[list[str], int]:
    """The distinct Wikipedia page ids of ranked passages, best first, through their titles; and how
    many passages had a title the map lacks (left out)."""
    pages: dict[str, None] = {}
    unmapped = 0
    for passage in passages:
        page = title_ids.get(passage.title)
        if page is None:
            unmapped += 1
        else:
            pages.setdefault(page, None)
    return list(pages), unmapped


# KILT's knowledge source as published (facebookresearch/KILT, README "KILT knowledge source"): one JSON
# page a line, 5,903,530 pages, 34.76 GiB, from the 2019/08/01 Wikipedia dump; each page has
# `wikipedia_id`, `wikipedia_title`, `text` (its paragraphs), `anchors`, `categories`, `history`.
KNOWLEDGE_SOURCE_URL = "http://dl.fbaipublicfiles.com/KILT/kilt_knowledgesource.json"
PAGE_KEYS = ("wikipedia_id", "wikipedia_title")
EXPECTED_SOURCE = (
    f"KILT's kilt_knowledgesource.json, one JSON page a line with {' and '.join(PAGE_KEYS)}, "
    f"from {KNOWLEDGE_SOURCE_URL}"
)


def knowledge_source_file(source: str | Path) -> Path:
    """`source` as KILT's knowledge source, or an InputError naming the file and what was expected: a
    missing, empty or folder path, or a first record that is not a page (another JSONL, a corpus)."""
    try:
        path = input_file(source)
    except InputError as err:
        raise InputError(f"{err.message}; expected {EXPECTED_SOURCE}", file=str(source)) from None
    with path.open("rb") as f:
        line_no, line = next(((n, raw) for n, raw in enumerate(f, start=1) if raw.strip()), (1, b""))
    try:
        first = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        first = None
    if not isinstance(first, dict):
        raise InputError(
            f"not a knowledge-source page: the first record is not a JSON object; expected {EXPECTED_SOURCE}",
            file=str(path),
            line=line_no,
        )
    missing = [key for key in PAGE_KEYS if key not in first]
    if missing:
        keys = ", ".join(list(first)[:6]) or "none"
        raise InputError(
            f"not a knowledge-source page: the first record lacks {' and '.join(missing)} (its keys: {keys}); "
            f"expected {EXPECTED_SOURCE}",
            file=str(path),
            line=line_no,
            field=missing[0],
        )
    return path


def _title_and_id(line: bytes, path: Path, line_no: int) -> tuple[str, str] | None:
    """(wikipedia_title, wikipedia_id) of one knowledge-source line. The page's text follows the two
    keys in the published file, so the part before `"text"` is parsed alone when it holds both."""
    cut = line.find(b', "text":')
    for candidate in ((line[:cut] + b"}") if cut > 0 else None, line):
        if candidate is None:
            continue
        try:
            page = json.loads(candidate)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(page, dict) and "wikipedia_id" in page and "wikipedia_title" in page:
            return str(page["wikipedia_title"]), str(page["wikipedia_id"])
    if not line.strip():
        return None
    raise InputError(
        "not a knowledge-source page (JSON with wikipedia_id and wikipedia_title)",
        file=str(path),
        line=line_no,
        field="wikipedia_title",
    )


def build_page_ids(knowledge_source: str | Path, out: str | Path, progress: bool = True) -> dict[str, int]:
    """Write the title -> page id map of KILT's knowledge source (`kilt_knowledgesource.json`, one
    page a line: `wikipedia_id`, `wikipedia_title`, `text` paragraphs). A title seen twice keeps its
    first page (the repeats are counted). Returns {"pages", "duplicate_titles"}."""
    from tqdm import tqdm

    path = knowledge_source_file(knowledge_source)
    mapping: dict[str, str] = {}
    duplicates = 0
    with (
        path.open("rb") as f,
        tqdm(desc="pages", unit=" pages", disable=None if progress else True, file=sys.stderr) as bar,
    ):
        for line_no, line in enumerate(f, start=1):
            found = _title_and_id(line, path, line_no)
            if found is None:
                continue
            title, page = found
            if title in mapping:
                duplicates += 1
            else:
                mapping[title] = page
            bar.update()
    if not mapping:
        raise InputError("no pages in the knowledge source", file=str(path))
    with atomic_write(out) as fh:
        json.dump(mapping, fh, ensure_ascii=False)
    return {"pages": len(mapping), "duplicate_titles": duplicates}


def write_kilt_submission(
    path: str | Path,
    ids: Sequence[str],
    records: Sequence[dict[str, Any] | None],
    corpus: Any | None,
    title_ids: dict[str, str] | None,
) -> int:
    """A KILT submission, one line per question id in order: the record's answer (empty where the
    prediction is missing) and, as provenance, the Wikipedia pages of the passages its question
    retrieved (`context_doc_ids`, mapped through their titles). Without a corpus and a title map the
    provenance stays empty (page ids cannot be guessed from passage ids), and a warning says so."""
    predictions, unmapped, cited = [], 0, 0
    for qid, record in zip(ids, records, strict=True):
        pages: list[str] = []
        if record is not None and corpus is not None and title_ids is not None:
            pages, lost = passage_pages(corpus.get_many(record.get("context_doc_ids") or []), title_ids)
            unmapped += lost
            cited += len(record.get("context_doc_ids") or [])
        answer = record_answer(record) if record is not None else ""
        predictions.append(KiltPrediction(qid, answer, tuple(pages)))
    if corpus is None or title_ids is None:
        print(
            f"warning: {path}: provenance left empty: page ids need --corpus and --page-ids "
            "(`corag kilt-pages` builds the map)",
            file=sys.stderr,
        )
    elif unmapped:
        print(
            f"warning: {path}: {unmapped} of {cited} cited passage(s) have a title the page map lacks",
            file=sys.stderr,
        )
    return write_submission(path, predictions)


def record_answer(record: dict[str, Any]) -> str:
    """A prediction record's answer: ours (`predictions`, the released schema's name) or the official
    inference's (`prediction`)."""
    value = record.get("predictions", record.get("prediction"))
    return value if isinstance(value, str) else ""
