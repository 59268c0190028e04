"""The evaluation stage: run methods over a dataset, score their predictions, compare them by compute.

A *run* is one method with fixed settings (`greedy:L=3`, `best_of_n:L=3:N=4`, `ircot:k=4`, ...).
`parse_runs` expands a grid (`best_of_n:L=2,4:N=2,4` is four runs). Each run writes
`<out>/<run>/predictions.jsonl` (appended per question, so an interrupted evaluation resumes) and
`<out>/<run>/metrics.json` (scores, answer parse failures, wall time and the run's settings; for KILT
tasks also `kilt_submission.jsonl`; with `--official-files`, the official inference's `preds_*.jsonl`
and `metrics_*.json`). A run split over processes answers contiguous parts of the questions, each in its
own folder (`<out>/parts/part-IIIII-of-NNNNN/<run>/`); `merge_parts` joins them, in question order, into
the records one process would have written. `results.md`, `results.csv` and `scaling.png` (accuracy
against mean tokens per question, with the Pareto frontier and, when it has four points or more, its
log fit) hold every run in the output folder, those of earlier calls included. Answers are scored by each benchmark's official
rule (`--rules official`), the CoRAG release's (`--rules corag`, the paper's numbers) or Search-R1's
(`--rules search-r1`, its EM).
"""

from __future__ import annotations

import inspect
import itertools
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from corag.chain import DecodeResult
from corag.cluster.stop import StopRequest
from corag.data.jsonl import JsonlAppender, atomic_write, input_file, iter_jsonl, recover_jsonl, write_jsonl
from corag.errors import InputError
from corag.executor import EXECUTORS
from corag.kilt import check_missing, passage_pages, record_answer
from corag.metrics import (
    answer_scores,
    cover_em,
    kilt_answer_scores,
    kilt_gold_answers,
    kilt_recall_at_k,
    max_over_golds,
    r_precision,
    recall_at_k,
    reciprocal_rank_fusion,
)
from corag.scaling import plot_scaling, write_table
from corag.tasks import RULES, get_task, task_description
from corag.types import Example

RECALL_KS = (5, 10, 20)
PAGE_KS = (1, 5)  # KILT reports page-level recall@5 (and R-precision)
# Short names usable in run specs, for the settings every method shares.
ALIASES = {"L": "max_steps", "N": "n", "b": "stop_bias"}


def methods() -> dict[str, Callable[..., Any]]:
    """Every selectable method: the CoRAG decoding strategies and the related methods."""
    from corag.decoding import STRATEGIES
    from corag.methods import METHODS

    return {**STRATEGIES, **METHODS}


@dataclass(frozen=True)
class Run:
    """One method with fixed settings; `name` is how tables and folders call it."""

    method: str
    settings: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        short = {v: k for k, v in ALIASES.items()}
        parts = [f"{short.get(k, k)}={v}" for k, v in self.settings]
        return ":".join([self.method, *parts])

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.settings)


def run_folder(out_dir: Path, run: Run) -> Path:
    """Where a run writes: its name, as a folder name."""
    return out_dir / run.name.replace(":", "_").replace("=", "")


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def parse_runs(specs: Iterable[str]) -> list[Run]:
    """`method[:key=v1,v2...]...` -> runs, one per point of the grid; unknown methods are an error."""
    known = methods()
    runs: list[Run] = []
    for spec in specs:
        method, *parts = spec.split(":")
        if method not in known:
            raise InputError(f"unknown method {method!r}; choose from {sorted(known)}", field="methods")
        keys, grids = [], []
        for part in parts:
            key, sep, values = part.partition("=")
            if not sep or not values:
                raise InputError(
                    f"bad setting {part!r} in {spec!r}: expected key=value[,value]", field="methods"
                )
            keys.append(ALIASES.get(key, key))
            grids.append([_value(v) for v in values.split(",")])
        for key, grid in zip(keys, grids, strict=True):
            _check_setting(known[method], method, key, grid, spec)
        for point in itertools.product(*grids):
            runs.append(Run(method, tuple(zip(keys, point, strict=True))))
    return runs


AT_LEAST_ONE = {"n", "expand", "beam", "max_rounds", "max_sentences", "k"}  # counts that 0 would empty


def _check_setting(function: Any, method: str, key: str, values: list[Any], spec: str) -> None:
    """A setting the method takes, of the type of its default (an int where it counts something; at
    least 0 for steps, at least 1 for samples and the like): refused in one line before anything loads."""
    parameters = inspect.signature(function).parameters
    if key not in parameters or key in ("ctx", "example", "corpus"):
        raise InputError(f"{method} has no setting {key!r} (in {spec!r})", field="methods")
    default = parameters[key].default
    lowest = 1 if key in AT_LEAST_ONE else 0
    key = {v: k for k, v in ALIASES.items()}.get(key, key)  # as the spec writes it (L, N)
    for value in values:
        if isinstance(default, int) and not isinstance(default, bool):
            if not isinstance(value, int) or isinstance(value, bool):
                raise InputError(f"{key} must be an integer, got {value!r} (in {spec!r})", field="methods")
            if value < lowest:
                raise InputError(
                    f"{key} must be {lowest} or more, got {value} (in {spec!r})", field="methods"
                )


# Running --------------------------------------------------------------------------------------------


def as_record(result: DecodeResult | dict[str, Any]) -> dict[str, Any]:
    """A strategy's result as a prediction record (CoRAG results carry their own record layout)."""
    return result.to_record() if isinstance(result, DecodeResult) else result


def done_ids(path: Path) -> set[str]:
    """Ids of the predictions already in `path` (none when it does not exist). A last line cut short
    by a crash is removed, so that question is answered again."""
    records, _ = recover_jsonl(path)
    ids = set()
    for line, record in enumerate(records, start=1):
        if not isinstance(record, dict) or "query_id" not in record:
            raise InputError("not a prediction record", file=str(path), line=line, field="query_id")
        ids.add(str(record["query_id"]))
    return ids


def check_resume(path: Path, questions: Sequence[Example], data: str) -> set[str]:
    """`done_ids` of a resume file, which must answer questions of `data` only: a file left by a run
    over other data is refused, before any model loads, rather than mixed with this run's answers."""
    done = done_ids(path)
    known = {e.id for e in questions}
    foreign = sorted(done - known)
    if foreign:
        raise InputError(
            f"holds predictions for {len(foreign)} question(s) that {data} does not have (first "
            f"{foreign[0]!r}): a run over other data; choose another output",
            file=str(path),
            record=foreign[0],
            field="query_id",
        )
    return done


def run_method(
    run: Run,
    examples: Sequence[Example],
    lm: Any,
    retriever: Any,
    corpus: Any,
    out_path: Path,
    *,
    budget: int | None = None,
    max_active: int = 64,
    progress: bool = True,
    extra_kwargs: dict[str, Any] | None = None,
    executor: str = "stepped",
    stop: StopRequest | None = None,
) -> list[dict[str, Any]] | None:
    """Predict every question not yet in `out_path`, appending records as questions finish (a re-run
    resumes); `executor` is a name in corag.executor.EXECUTORS. Once every question is answered the
    file is rewritten in question order, so that it does not depend on which question finished first
    (and the parts of a split run join into the same bytes). Returns every question's record.

    Once `stop` is set (Slurm's warning before the time limit), the run ends after the record in hand:
    no question starts, those in flight are abandoned, the file holds whole lines, and None is returned
    while questions are left (a rerun answers them)."""
    strategy = methods()[run.method]
    kwargs = {**(extra_kwargs or {}), **run.kwargs}
    done = done_ids(out_path)
    todo = [e for e in examples if e.id not in done]
    if not todo:
        return read_predictions(out_path, examples, require_all=True)
    with JsonlAppender(out_path) as out:
        runner = EXECUTORS[executor](lm, retriever, max_active=max_active)
        coros = (
            unless_stopped(strategy(runner.context(budget), e, corpus=corpus, **kwargs), stop) for e in todo
        )
        bar = tqdm(total=len(todo), desc=run.name, unit="q", disable=not progress, file=sys.stderr)
        stream = runner.stream(coros)
        try:
            for _, result in stream:
                if result is not None:
                    out.append({**as_record(result), "run": run.name})
                    bar.update(1)
                if stop is not None and stop.received:
                    break
        finally:
            stream.close()
            bar.close()
    if stop is not None and stop.received and unanswered(out_path, examples):
        return None
    records = read_predictions(out_path, examples, require_all=True)
    write_jsonl(out_path, records)  # type: ignore[arg-type]  # every record is there (require_all)
    return records


async def unless_stopped(coro: Coroutine[Any, Any, Any], stop: StopRequest | None) -> Any:
    """`coro`'s result, or None without running it once `stop` is set (a question not started)."""
    if stop is not None and stop.received:
        coro.close()
        return None
    return await coro


# Parts of a run ---------------------------------------------------------------------------------------

PARTS = "parts"  # <out>/parts/part-IIIII-of-NNNNN/<run>/: one part's predictions and metrics


def part_questions(examples: Sequence[Example], shard: int, num_shards: int) -> list[Example]:
    """Part `shard` of `num_shards`: a contiguous run of the questions, the parts' sizes within one."""
    n = len(examples)
    return list(examples[shard * n // num_shards : (shard + 1) * n // num_shards])


def part_folder(out_dir: Path, shard: int, num_shards: int) -> Path:
    """Where part `shard` of `num_shards` writes its runs' folders (never the final files)."""
    return out_dir / PARTS / f"part-{shard:05d}-of-{num_shards:05d}"


def unanswered(path: Path, examples: Sequence[Example]) -> list[str]:
    """Ids of `examples` without a prediction in `path`, reading it only (a last line cut short by a
    crash, or a file not there, answers nothing)."""
    answered: set[str] = set()
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True):
            if not line.endswith("\n"):
                break
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # damage: read_predictions names it when the file is read for real
            if isinstance(record, dict) and "query_id" in record:
                answered.add(str(record["query_id"]))
    return [e.id for e in examples if e.id not in answered]


def part_finished(folder: Path, examples: Sequence[Example]) -> bool:
    """Whether a part's run folder holds every prediction of its questions and its metrics."""
    return (folder / "metrics.json").is_file() and not unanswered(folder / "predictions.jsonl", examples)


def merge_parts(folders: Sequence[Path], examples: Sequence[Example]) -> tuple[list[dict[str, Any]], float]:
    """A run answered in `len(folders)` parts (folder i answers `part_questions(examples, i, n)`): every
    record in question order, and the longest part's wall time. A part not run or not finished is an
    InputError naming its file and what it lacks."""
    n, records, seconds = len(folders), [], 0.0
    for i, folder in enumerate(folders):
        wanted = part_questions(examples, i, n)
        if not wanted:
            continue
        path, rerun = folder / "predictions.jsonl", f"run part {i} of {n} (--shard {i} --num-shards {n})"
        missing = unanswered(path, wanted)
        if missing:
            state = "was not run" if not path.exists() else "is unfinished"
            raise InputError(
                f"part {i} of {n} {state}: {len(missing)} of its {len(wanted)} question(s) unanswered "
                f"(first {missing[0]!r}); {rerun}, then merge",
                file=str(path),
            )
        if not (folder / "metrics.json").is_file():
            raise InputError(f"part {i} of {n} has no metrics.json; {rerun}, then merge", file=str(folder))
        records += read_predictions(path, wanted, require_all=True)
        metrics = _read_json(folder / "metrics.json")
        seconds = max(seconds, float(metrics.get("wall_seconds", 0.0)))
    return records, seconds  # type: ignore[return-value]  # every record is there (require_all)


# Scoring --------------------------------------------------------------------------------------------

# How answers are scored: "official" applies each task's official rule (corag.tasks), "corag" the CoRAG
# release's (SQuAD EM and F1 for every dataset, as the paper reports), "search-r1" Search-R1's (its EM,
# corag.metrics), a rule name forces that rule.
RULE_CHOICES = ("official", "corag", "search-r1", *RULES)


def rule_of(example: Example, rules: str = "official") -> str:
    """The rule that scores `example` under `rules` ("official", "corag", "search-r1", a rule or a task
    name)."""
    if rules == "official":
        return get_task(example.task).rule
    if rules == "corag":
        return "squad"
    if rules == "search-r1" or rules in RULES:
        return rules
    return get_task(rules, field="--rules").rule


def read_predictions(
    path: Path, examples: Sequence[Example], *, require_all: bool = False, known: Iterable[str] = ()
) -> list[dict[str, Any] | None]:
    """Prediction records aligned with `examples`, ours (`predictions`) or the official inference's
    (`preds_*.jsonl`, field `prediction`) alike; a clear error for a repeated, unknown or badly typed
    record (naming the file, line, id and field). A question without a prediction is None: it counts 0,
    as the official scripts count it, with a warning (`require_all` refuses instead). Ids in `known`
    (questions left out by --limit) are skipped, not unknown."""
    wanted = {e.id for e in examples}
    skipped = set(known) - wanted
    by_id: dict[str, dict[str, Any]] = {}
    for line, record in iter_jsonl(input_file(path)):
        qid = record.get("query_id")
        where = {"file": str(path), "line": line}
        if isinstance(qid, int) and not isinstance(qid, bool):
            qid = str(qid)  # ids are strings or integers in every file corag reads, as in KILT's
        if not isinstance(qid, str):
            raise InputError("expected a string or integer query id", field="query_id", **where)
        if qid in by_id:
            raise InputError("duplicate prediction", record=qid, field="query_id", **where)
        if qid in skipped:
            continue
        if qid not in wanted:
            raise InputError(
                "prediction for a question not in the dataset", record=qid, field="query_id", **where
            )
        field = "predictions" if "predictions" in record else "prediction"
        if not isinstance(record.get(field), str):
            raise InputError("expected a string prediction", record=qid, field=field, **where)
        usage = record.get("usage", {})
        if not isinstance(usage, dict) or not isinstance(usage.get("total_tokens", 0), int):
            raise InputError(
                "expected usage.total_tokens to be an integer", record=qid, field="usage", **where
            )
        by_id[qid] = record
    if not by_id:
        raise InputError("no predictions in the file", file=str(path))
    check_missing(
        [e.id for e in examples if e.id not in by_id], len(examples), str(path), "query_id", require_all
    )
    return [by_id.get(e.id) for e in examples]


def chain_doc_lists(record: dict[str, Any]) -> list[list[str]]:
    """The ranked lists a prediction retrieved: the question's own, then each step's."""
    lists = [list(record.get("context_doc_ids", []))]
    lists += [list(step.get("doc_ids", [])) for step in record.get("steps", [])]
    return [docs for docs in lists if docs]


def answer_row(prediction: str | None, example: Example, rule: str) -> dict[str, float]:
    """One question's answer metrics under `rule`; a missing prediction scores 0 on each. KILT's rule
    adds strict accuracy and ROUGE-L, and scores the stripped answer (an empty one 0), as KILT does."""
    kilt = rule == "kilt"
    if prediction is None:
        return dict.fromkeys(("em", "f1", "cover_em", *(("accuracy", "rougel") if kilt else ())), 0.0)
    if kilt:
        scores = kilt_answer_scores(prediction, example.answers)
        empty = not prediction.strip()
        cover = 0.0 if empty else max_over_golds(cover_em, prediction, kilt_gold_answers(example.answers))
        return {"em": scores["em"], "f1": scores["f1"], "cover_em": cover, **scores}
    scores = answer_scores(prediction, example.answers, rule)
    return {"em": scores["em"], "f1": scores["f1"], "cover_em": scores["cover_em"]}


def _mean(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Mean of each key over the rows that have it (rows of KILT and other tasks may mix)."""
    sums: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for key, value in row.items():
            sums[key].append(value)
    return {key: sum(v) / len(v) for key, v in sums.items()}


PageLookup = Callable[[Sequence[str]], list[str]]


def page_rows(example: Example, record: dict[str, Any] | None, pages: PageLookup) -> dict[str, float]:
    """KILT's page-level retrieval of one question: R-precision and recall@k of the Wikipedia pages of
    its retrieved passages, the question's own list (`context_doc_ids`, the pages its KILT submission
    cites) and the chain's lists fused by RRF. A question without gold pages scores 0, as KILT counts
    it (facebookresearch/KILT, kilt/eval_retrieval.py at c730838: `_computeRprec` gives 0 when the gold
    set is empty, `get_ranking_metrics` leaves recall@k and precision@k at 0 without an evidence set,
    and `compute` divides each sum by the number of questions)."""
    gold_sets = example.meta.get("evidence") or [list(example.supporting_pages)]
    if not any(gold_sets):
        return {key: 0.0 for name in ("question", "chain_rrf") for key in _page_keys(name)}
    lists = chain_doc_lists(record) if record is not None else []
    fused = [hit.doc_id for hit in reciprocal_rank_fusion(lists)] if lists else []
    own = list(record.get("context_doc_ids") or []) if record is not None else []
    row = {}
    for name, docs in (("question", own), ("chain_rrf", fused)):
        guess = pages(docs)
        row[f"Rprec_{name}"] = r_precision(guess, gold_sets)
        for k in PAGE_KS:
            row[f"page_recall@{k}_{name}"] = kilt_recall_at_k(guess, gold_sets, k)
    return row


def _page_keys(name: str) -> list[str]:
    return [f"Rprec_{name}", *(f"page_recall@{k}_{name}" for k in PAGE_KS)]


def score_records(
    examples: Sequence[Example],
    records: Sequence[dict[str, Any] | None],
    rules: str = "official",
    *,
    pages: PageLookup | None = None,
) -> dict[str, Any]:
    """Answer metrics in points, by the rule `rules` names for each question (missing predictions count
    0), and KILT's accuracy, ROUGE-L and KILT-variants for KILT tasks; tokens and calls per predicted
    question; EM by hop count; recall@k of gold passages (only where gold passage ids exist) for the
    question's retrieval alone and for all the chain's lists fused by RRF; with `pages` (passage ids ->
    Wikipedia page ids), KILT's page-level R-precision and recall@k over every question of a KILT task
    whatever the rule (0 without gold pages, as KILT counts it) and elsewhere where gold pages exist;
    KILT-variants under KILT's rule. Test questions (no gold answers) get no answer metrics. The task
    and the rule that scored it (`task`, `rule`: "mixed" when several; `rule_by_task`), and the
    official release's keys (`num_samples`, `token_consumed`, `average_token_consumed_per_sample`).
    Counts of the records' answers: `empty_predictions`, `answer_fallbacks` (answers a method took from
    free text because the reply missed its format) and `parse_failures` (replies that missed the
    format, summed)."""
    rows, by_hops, kilt_rows = [], defaultdict(list), []
    recall: dict[str, list[float]] = defaultdict(list)
    costs = [r for r in records if r is not None]
    for example, record in zip(examples, records, strict=True):
        prediction = record_answer(record) if record is not None else None
        rule = rule_of(example, rules)
        if example.answers:
            row = answer_row(prediction, example, rule)
            rows.append(row)
            if "hops" in example.meta:
                by_hops[int(example.meta["hops"])].append(row["em"])
        gold = set(example.supporting_ids)
        lists = chain_doc_lists(record) if record is not None else []
        if gold:
            fused = [hit.doc_id for hit in reciprocal_rank_fusion(lists)] if lists else []
            for k in RECALL_KS:
                recall[f"recall@{k}_question"].append(recall_at_k(lists[0] if lists else [], gold, k))
                recall[f"recall@{k}_chain_rrf"].append(recall_at_k(fused, gold, k))
        # KILT averages page metrics over every question of a KILT task (those without gold pages
        # count 0), whatever rule scores the answers; elsewhere, over the questions with gold pages
        if pages is not None and (example.supporting_pages or get_task(example.task).is_kilt):
            page_row = page_rows(example, record, pages)
            for key, value in page_row.items():
                recall[key].append(value)
            if example.answers and rule == "kilt":
                hit = page_row["Rprec_question"] == 1
                kilt_rows.append(
                    {f"KILT-{m}": rows[-1][m] if hit else 0.0 for m in ("accuracy", "em", "f1", "rougel")}
                )
    tokens = [float(r.get("usage", {}).get("total_tokens", 0)) for r in costs]
    calls = [float(r.get("model_calls", 0)) for r in costs]
    summary: dict[str, Any] = {key: 100 * value for key, value in _mean(rows).items()}
    summary.update({key: 100 * value for key, value in _mean(kilt_rows).items()})
    summary["tokens_per_question"] = sum(tokens) / len(tokens) if tokens else 0.0
    summary["calls_per_question"] = sum(calls) / len(calls) if calls else 0.0
    summary["count"] = len(examples)
    summary["answered"] = len(rows)
    summary["missing"] = len(records) - len(costs)
    summary["empty_predictions"] = sum(not record_answer(r).strip() for r in costs)
    summary["answer_fallbacks"] = sum(r.get("answer_source") == "text" for r in costs)
    summary["parse_failures"] = sum(int(r.get("parse_failures") or 0) for r in costs)
    summary["rules"] = rules
    rule_by_task = {e.task: rule_of(e, rules) for e in examples}
    tasks, used = set(rule_by_task), set(rule_by_task.values())
    summary["task"] = tasks.pop() if len(tasks) == 1 else "mixed"
    summary["rule"] = used.pop() if len(used) == 1 else "mixed"
    summary["rule_by_task"] = rule_by_task
    summary["em_by_hops"] = {str(h): 100 * sum(v) / len(v) for h, v in sorted(by_hops.items())}
    summary.update({key: 100 * sum(v) / len(v) for key, v in sorted(recall.items())})
    summary["num_samples"] = len(examples)
    summary["token_consumed"] = int(sum(tokens))
    summary["average_token_consumed_per_sample"] = sum(tokens) / len(examples) if examples else 0.0
    return summary


# Tables ---------------------------------------------------------------------------------------------

TABLE_COLUMNS = ["run", "em", "f1", "cover_em", "tokens_per_question", "calls_per_question"]


def write_results(results: dict[str, dict[str, Any]], out_dir: Path, metric: str = "em") -> dict[str, Path]:
    """The sweep's table (markdown and CSV) and scaling plot."""
    hop_keys = sorted({h for r in results.values() for h in r.get("em_by_hops", {})}, key=int)
    described = [c for c in ("model", "spec") if any(c in r for r in results.values())]
    columns = TABLE_COLUMNS[:1] + described + TABLE_COLUMNS[1:] + [f"em_{h}hop" for h in hop_keys]
    rows = []
    for name, summary in results.items():
        row = {"run": name, **{k: v for k, v in summary.items() if not isinstance(v, dict)}}
        row.update({f"em_{h}hop": v for h, v in summary.get("em_by_hops", {}).items()})
        rows.append(row)
    md, csv_path = write_table(rows, columns, out_dir / "results")
    names = list(results)
    png = plot_scaling(
        names,
        [max(results[n].get("tokens_per_question", 0.0), 1.0) for n in names],
        [results[n].get(metric, 0.0) for n in names],
        out_dir / "scaling.png",
        ylabel=metric.upper(),
    )
    return {"table": md, "csv": csv_path, "plot": png}


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; anything else is a one-line InputError."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON ({exc.msg})", file=str(path), line=exc.lineno) from None
    if not isinstance(value, dict):
        raise InputError("expected a JSON object", file=str(path))
    return value


def folder_results(out_dir: Path) -> dict[str, dict[str, Any]]:
    """Every run's metrics in an evaluation folder (`<out>/<run>/metrics.json`), by run name, in the
    order they finished (earlier calls' runs included); a file that is not JSON is a one-line error."""
    found = []
    for path in sorted(out_dir.glob("*/metrics.json")):
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError(f"invalid JSON ({exc.msg})", file=str(path), line=exc.lineno) from None
        if isinstance(summary, dict):
            found.append((str(summary.get("finished_at", "")), summary.get("run", path.parent.name), summary))
    found.sort(key=lambda item: item[0])
    return {name: summary for _, name, summary in found}


MERGED_COLUMNS = ["dataset", "run", "count", "em", "f1", "tokens_per_question", "calls_per_question"]

# The CoRAG paper's Table 1 for CoRAG-8B, the released checkpoint (EM, F1), by data set and run.
PAPER_TABLE1: dict[str, dict[str, tuple[float, float]]] = {
    "2wikimultihopqa": {
        "greedy:L=6": (70.6, 75.5), "best_of_n:L=6:N=4": (71.7, 76.5),
        "tree_search:L=6": (71.7, 76.4), "best_of_n:L=10:N=8": (72.5, 77.3),
    },
    "hotpotqa": {
        "greedy:L=6": (54.4, 67.5), "best_of_n:L=6:N=4": (55.3, 68.5),
        "tree_search:L=6": (55.8, 69.0), "best_of_n:L=10:N=8": (56.3, 69.8),
    },
    "bamboogle": {
        "greedy:L=6": (48.0, 63.5), "best_of_n:L=6:N=4": (51.2, 63.1),
        "tree_search:L=6": (48.8, 64.4), "best_of_n:L=10:N=8": (54.4, 68.3),
    },
    "musique": {
        "greedy:L=6": (27.7, 38.5), "best_of_n:L=6:N=4": (28.1, 39.7),
        "tree_search:L=6": (29.0, 40.3), "best_of_n:L=10:N=8": (30.9, 42.4),
    },
}  # fmt: skip


def paper_figures(dataset: str, run: str) -> tuple[float, float] | None:
    """The paper's (EM, F1) for a questions file's folder (`musique_validation`) and run, if it has one."""
    return PAPER_TABLE1.get(dataset.split("_")[0], {}).get(run)


def merged_results(root: Path) -> Path:
    """One table over the evaluation folders under `root` (`<root>/<dataset>/<run>/metrics.json`, as
    evaluation/slurm_eval.sh writes them): a row per dataset and run, written to `<root>/results.md` and
    `results.csv`, with the paper's EM and F1 beside the measured ones where Table 1 has the row; an
    InputError when there is none."""
    rows = [
        {"dataset": folder.name, "run": name, **summary}
        for folder in sorted(p for p in root.iterdir() if p.is_dir())
        for name, summary in folder_results(folder).items()
    ]
    if not rows:
        raise InputError("no <dataset>/<run>/metrics.json under this folder", file=str(root))
    columns = list(MERGED_COLUMNS)
    for row in rows:
        if (paper := paper_figures(row["dataset"], row["run"])) is not None:
            row["paper_em"], row["paper_f1"] = paper
    if any("paper_em" in row for row in rows):  # the paper's figure beside the measured one
        columns[4:4] = ["paper_em"]
        columns[6:6] = ["paper_f1"]
    md, _ = write_table(rows, columns, root / "results")
    return md


# Official files ---------------------------------------------------------------------------------------


def eval_task(examples: Sequence[Example]) -> str:
    """The task name the official files use (KILT's own name for KILT tasks), or "mixed"."""
    names = {get_task(e.task).kilt or e.task for e in examples}
    return names.pop() if len(names) == 1 else "mixed"


def official_strategy(run: Run) -> tuple[str, int]:
    """(decode_strategy, max_path_length) as the official inference names a CoRAG run (L < 1 is greedy)."""
    length = int(run.kwargs.get("max_steps", 6))
    return ("greedy" if length < 1 else run.method), length


def write_official_files(
    folder: Path, run: Run, examples: Sequence[Example], records: Sequence[dict[str, Any] | None], split: str
) -> list[Path]:
    """The official inference's files for a CoRAG run, beside ours: `preds_{strategy}_{task}_{split}.jsonl`
    (the question's fields, `task_desc`, `prediction`, `subqueries`, `subanswers`) and
    `metrics_{task}_{split}_{strategy}.json` (its keys; EM and F1 by its rule, SQuAD's, rounded to 3;
    none for a test split)."""
    strategy, length = official_strategy(run)
    task = eval_task(examples)
    preds = folder / f"preds_{strategy}_{task}_{split}.jsonl"
    lines = []
    for example, record in zip(examples, records, strict=True):
        if record is None:
            continue
        lines.append(
            {
                "query": example.query,
                "answers": list(example.answers),
                "query_id": example.id,
                "task_desc": task_description(example.task, example.meta),
                "prediction": record_answer(record),
                "subqueries": list(record.get("subqueries", [])),
                "subanswers": list(record.get("subanswers", [])),
            }
        )
    write_jsonl(preds, lines)
    scored = score_records(examples, records, "corag")
    if not scored["answered"]:  # a test split: nothing to score, no metrics file
        return [preds]
    metrics = {
        "em": round(scored.get("em", 0.0), 3),
        "f1": round(scored.get("f1", 0.0), 3),
        "num_samples": len(examples),
        "eval_task": task,
        "eval_split": split,
        "max_path_length": length,
        "decode_strategy": strategy,
        "token_consumed": scored["token_consumed"],
        "average_token_consumed_per_sample": scored["average_token_consumed_per_sample"],
    }
    metrics_path = folder / f"metrics_{task}_{split}_{strategy}.json"
    write_json(metrics_path, metrics)
    return [preds, metrics_path]


def write_json(path: Path, value: Any) -> None:
    """`value` as indented JSON, written atomically."""
    with atomic_write(path) as fh:
        fh.write(json.dumps(value, indent=2) + "\n")


def page_lookup(corpus: Any | None, title_ids: dict[str, str] | None) -> PageLookup | None:
    """Doc ids -> KILT pages through the corpus's titles, when both are given."""
    if corpus is None or title_ids is None:
        return None
    return lambda doc_ids: passage_pages(corpus.get_many(doc_ids), title_ids)[0]
