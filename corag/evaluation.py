"""The evaluation stage: run methods over a dataset, score their predictions, compare them by compute.

A *run* is one method with fixed settings (`greedy:L=3`, `best_of_n:L=3:N=4`, `ircot:k=4`, ...).
`parse_runs` expands a grid (`best_of_n:L=2,4:N=2,4` is four runs). Each run writes
`<out>/<run>/predictions.jsonl` (appended per question, so an interrupted evaluation resumes) and
`<out>/<run>/metrics.json`; the sweep writes `results.md`, `results.csv` and `scaling.png`
(accuracy against mean tokens per question, with the Pareto frontier and, when it has four points or
more, its log fit).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from corag.budget import Meter
from corag.chain import DecodeResult
from corag.data.jsonl import JsonlAppender, atomic_write, iter_jsonl
from corag.errors import InputError
from corag.executor import Context, Executor
from corag.metrics import (
    answer_scores,
    mean_scores,
    recall_at_k,
    reciprocal_rank_fusion,
    rouge_l,
    strict_accuracy,
)
from corag.scaling import plot_scaling, write_table
from corag.types import Example

RECALL_KS = (5, 10, 20)
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
        for point in itertools.product(*grids):
            runs.append(Run(method, tuple(zip(keys, point, strict=True))))
    return runs


# Running --------------------------------------------------------------------------------------------


def as_record(result: DecodeResult | dict[str, Any]) -> dict[str, Any]:
    """A strategy's result as a prediction record (CoRAG results carry their own record layout)."""
    return result.to_record() if isinstance(result, DecodeResult) else result


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
) -> list[dict[str, Any]]:
    """Predict every question not yet in `out_path`, appending records as questions finish."""
    strategy = methods()[run.method]
    kwargs = {**(extra_kwargs or {}), **run.kwargs}
    with JsonlAppender(out_path) as out:
        done = {r.get("query_id") for r in out.existing}
        todo = [e for e in examples if e.id not in done]
        executor = Executor(lm, retriever, max_active=max_active)

        def start(example: Example) -> Any:
            ctx = Context(lm, retriever, Meter(budget=budget))
            return strategy(ctx, example, corpus=corpus, **kwargs)

        bar = tqdm(total=len(todo), desc=run.name, unit="q", disable=not progress, file=sys.stderr)
        for _, result in executor.map(start, todo):
            out.append({**as_record(result), "run": run.name})
            bar.update(1)
        bar.close()
    return read_predictions(out_path, examples)


# Scoring --------------------------------------------------------------------------------------------


def read_predictions(path: Path, examples: Sequence[Example]) -> list[dict[str, Any]]:
    """Prediction records aligned with `examples`; a clear error for a missing, repeated, unknown or
    badly typed record (naming the file, line, id and field)."""
    wanted = {e.id for e in examples}
    by_id: dict[str, dict[str, Any]] = {}
    for line, record in iter_jsonl(path):
        qid = record.get("query_id")
        where = {"file": str(path), "line": line}
        if not isinstance(qid, str):
            raise InputError("expected a string query id", field="query_id", **where)
        if qid in by_id:
            raise InputError("duplicate prediction", record=qid, field="query_id", **where)
        if qid not in wanted:
            raise InputError(
                "prediction for a question not in the dataset", record=qid, field="query_id", **where
            )
        if not isinstance(record.get("predictions"), str):
            raise InputError("expected a string prediction", record=qid, field="predictions", **where)
        usage = record.get("usage", {})
        if not isinstance(usage, dict) or not isinstance(usage.get("total_tokens", 0), int):
            raise InputError(
                "expected usage.total_tokens to be an integer", record=qid, field="usage", **where
            )
        by_id[qid] = record
    missing = [e.id for e in examples if e.id not in by_id]
    if missing:
        raise InputError(
            f"no prediction for {len(missing)} question(s)",
            file=str(path),
            record=missing[0],
            field="query_id",
        )
    return [by_id[e.id] for e in examples]


def chain_doc_lists(record: dict[str, Any]) -> list[list[str]]:
    """The ranked lists a prediction retrieved: the question's own, then each step's."""
    lists = [list(record.get("context_doc_ids", []))]
    lists += [list(step.get("doc_ids", [])) for step in record.get("steps", [])]
    return [docs for docs in lists if docs]


def score_records(
    examples: Sequence[Example], records: Sequence[dict[str, Any]], dataset: str = "squad", kilt: bool = False
) -> dict[str, Any]:
    """Answer metrics (in points), tokens and calls per question, EM by hop count, and recall@k of
    gold passages for the question's retrieval alone and for all the chain's lists fused by RRF."""
    rows, by_hops = [], defaultdict(list)
    recall: dict[str, list[float]] = defaultdict(list)
    for example, record in zip(examples, records, strict=True):
        scores = answer_scores(record["predictions"], example.answers, dataset)
        row = {"em": scores["em"], "f1": scores["f1"], "cover_em": scores["cover_em"]}
        if kilt:
            row["accuracy"] = strict_accuracy(record["predictions"], example.answers)
            row["rougel"] = max(rouge_l(record["predictions"], a) for a in example.answers)
        row["tokens"] = float(record.get("usage", {}).get("total_tokens", 0))
        row["calls"] = float(record.get("model_calls", 0))
        rows.append(row)
        if "hops" in example.meta:
            by_hops[int(example.meta["hops"])].append(row["em"])
        gold = set(example.supporting_ids)
        lists = chain_doc_lists(record)
        if gold and lists:
            fused = [hit.doc_id for hit in reciprocal_rank_fusion(lists)]
            for k in RECALL_KS:
                recall[f"recall@{k}_question"].append(recall_at_k(lists[0], gold, k))
                recall[f"recall@{k}_chain_rrf"].append(recall_at_k(fused, gold, k))
    mean = mean_scores(rows)
    summary: dict[str, Any] = {
        key: 100 * value for key, value in mean.items() if key not in ("tokens", "calls")
    }
    summary["tokens_per_question"] = mean.get("tokens", 0.0)
    summary["calls_per_question"] = mean.get("calls", 0.0)
    summary["count"] = len(rows)
    summary["em_by_hops"] = {str(h): 100 * sum(v) / len(v) for h, v in sorted(by_hops.items())}
    summary.update({key: 100 * sum(v) / len(v) for key, v in sorted(recall.items())})
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
        [max(results[n]["tokens_per_question"], 1.0) for n in names],
        [results[n][metric] for n in names],
        out_dir / "scaling.png",
        ylabel=metric.upper(),
    )
    return {"table": md, "csv": csv_path, "plot": png}


# Command line ---------------------------------------------------------------------------------------


def _write_json(path: Path, value: Any) -> None:
    with atomic_write(path) as fh:
        fh.write(json.dumps(value, indent=2) + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="corag evaluate", description=__doc__.splitlines()[0])
    p.add_argument(
        "--data", required=True, help="questions (HotpotQA, 2Wiki, MuSiQue, Bamboogle, KILT, JSONL)"
    )
    p.add_argument("--fmt", default=None, help="format of --data (told by its records' keys when not given)")
    p.add_argument(
        "--task", default=None, help="task of the questions (default: the records' own, else the file name's)"
    )
    p.add_argument("--aliases", default=None, help="2WikiMultihopQA id_aliases.json (aliases and demonyms)")
    p.add_argument("--dataset", default=None, help="metric rules: hotpotqa, 2wikimultihopqa, musique, ... ")
    p.add_argument("--out-dir", required=True, type=Path)
    p.add_argument("--predictions", type=Path, help="score this prediction file instead of running a model")
    p.add_argument("--model", help="checkpoint folder (or hub name)")
    p.add_argument("--backend", default="hf", choices=["hf", "vllm"])
    p.add_argument("--corpus", help="corpus file or folder")
    p.add_argument("--retriever", help="index folder from `corag index`, or a service URL")
    p.add_argument(
        "--methods",
        nargs="+",
        default=["greedy:L=3"],
        help="runs as method[:key=v1,v2]...; grids expand (e.g. best_of_n:L=2,4:N=2,4)",
    )
    p.add_argument("--demonstrations", type=Path, help="IRCoT demonstrations JSONL (for ircot and baselines)")
    p.add_argument("--budget", type=int, default=None, help="token budget per question")
    p.add_argument("--limit", type=int, default=None, help="only the first N questions")
    p.add_argument("--max-active", type=int, default=64, help="questions in flight at once")
    p.add_argument("--page-ids", type=Path, help="KILT: JSON mapping passage titles to Wikipedia ids")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from corag.data.formats import detect_format, load_examples
    from corag.decoding.predict import question_options

    fmt = args.fmt or detect_format(args.data)
    examples = load_examples(args.data, fmt, **question_options(args))[: args.limit]
    dataset = args.dataset or (examples[0].task if examples else "squad")
    dataset = dataset if dataset in ("hotpotqa", "2wikimultihopqa", "musique") else "squad"
    kilt = fmt == "kilt"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.predictions:
        summary = score_records(examples, read_predictions(args.predictions, examples), dataset, kilt)
        _write_json(args.out_dir / "metrics.json", summary)
        print(json.dumps(summary, indent=2))
        return 0
    for name in ("model", "corpus", "retriever"):
        if not getattr(args, name):
            raise SystemExit(f"corag evaluate: --{name} is required unless --predictions is given")
    runs = parse_runs(args.methods)
    from corag.data.corpus import Corpus
    from corag.lm import load_lm
    from corag.retrieval import load_retriever

    corpus, lm, retriever = (
        Corpus.load(args.corpus),
        load_lm(args.model, args.backend),
        load_retriever(args.retriever),
    )
    extra: dict[str, Any] = {}
    if args.demonstrations:
        from corag.methods.demos import load_demonstrations

        extra["demonstrations"] = load_demonstrations(args.demonstrations)
    results = {}
    for run in runs:
        folder = args.out_dir / run.name.replace(":", "_").replace("=", "")
        method_extra = extra if run.method in ("ircot", "one_step", "no_retrieval") else {}
        records = run_method(
            run, examples, lm, retriever, corpus, folder / "predictions.jsonl",
            budget=args.budget, max_active=args.max_active, extra_kwargs=method_extra,
        )  # fmt: skip
        results[run.name] = score_records(examples, records, dataset, kilt)
        _write_json(folder / "metrics.json", results[run.name])
        if kilt:
            write_kilt_submission(folder / "kilt_submission.jsonl", records, corpus, args.page_ids)
    paths = write_results(results, args.out_dir)
    print(paths["table"].read_text())
    print(f"predictions and metrics in {args.out_dir}/<run>/; table {paths['table']}; plot {paths['plot']}")
    return 0


def write_kilt_submission(
    path: Path, records: Sequence[dict[str, Any]], corpus: Any, page_ids: Path | None
) -> int:
    """A KILT submission from prediction records: the answer, and as provenance the pages of the
    question's retrieved passages (titles mapped to Wikipedia ids with `page_ids`, else the title)."""
    from corag.kilt import KiltPrediction, write_submission

    mapping = json.loads(page_ids.read_text()) if page_ids else {}
    predictions = []
    for record in records:
        passages = corpus.get_many(record.get("context_doc_ids", []))
        pages = tuple(str(mapping.get(p.title, p.title)) for p in passages)
        predictions.append(KiltPrediction(record["query_id"], record["predictions"], pages))
    return write_submission(path, predictions)
