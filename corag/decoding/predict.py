"""`corag predict`: run a decoding strategy over a question file and write predictions as JSONL.

Each line holds the official CoRAG prediction fields (query, answers, query_id, context_doc_ids,
subqueries, subanswers, predictions) and ours (strategy, steps with doc ids, usage, model calls, and
strategy extras). Engine settings and generation limits: corag.settings, from flags or `--config`.
Lines are appended and flushed as questions finish; a re-run skips ids already in
the output, so an interrupted run resumes without loss or duplicates.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from corag.async_executor import EXECUTORS, add_executor_argument
from corag.chain import FINAL_DOCS, check_dataset_docs
from corag.config import parse_args_with_config
from corag.decoding import STRATEGIES, get_strategy
from corag.errors import InputError
from corag.settings import EngineSettings, GenerationLimits, add_arguments, pick
from corag.tasks import get_task
from corag.types import Example


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="corag predict", description="Run a CoRAG decoding strategy over questions."
    )
    p.add_argument("--model", required=True, help="checkpoint folder (chat model)")
    p.add_argument("--data", required=True, help="questions file (plain JSONL or a benchmark format)")
    p.add_argument("--format", default=None, help="questions format (default: detected from the file)")
    p.add_argument("--corpus", required=True, help="corpus file (.jsonl, .parquet, .arrow) or dataset folder")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", help="retriever folder written by `corag index`")
    where.add_argument("--retriever-url", help="URL of a `corag serve-retriever` service")
    p.add_argument("--strategy", default="greedy", help=f"one of {sorted(STRATEGIES)}")
    p.add_argument("--max-steps", type=int, default=6, help="chain length L (0: answer from documents only)")
    p.add_argument("--n", type=int, default=4, help="chains for best_of_n")
    p.add_argument("--stop-bias", type=float, default=None, help="learned stop with this logit bias on Yes")
    p.add_argument("--budget", type=int, default=None, help="token budget per question")
    p.add_argument(
        "--final-docs",
        default="auto",
        choices=FINAL_DOCS,
        help="final answer's documents: the data's context_doc_ids when it has them (auto, as the official "
        "inference), always them (dataset), or a search of the question (retrieve)",
    )
    p.add_argument(
        "--task",
        default=None,
        help="task of the questions (nq, kilt_hotpotqa, ...; default: the records' own, else the name's)",
    )
    p.add_argument("--aliases", default=None, help="2WikiMultihopQA id_aliases.json (aliases and demonyms)")
    p.add_argument("--max-active", type=int, default=256, help="questions decoded at once")
    add_executor_argument(p)
    p.add_argument("--limit", type=int, default=None, help="only the first N questions")
    p.add_argument("--out", required=True, help="predictions JSONL (appended; re-runs resume)")
    p.add_argument(
        "--official-files",
        action="store_true",
        help="also write the official inference's preds_{strategy}_{task}_{split}.jsonl and metrics file",
    )
    p.add_argument(
        "--split", default=None, help="split name for the official files (default: from the file name)"
    )
    add_arguments(p, EngineSettings)
    add_arguments(p, GenerationLimits)
    return parse_args_with_config(p, argv)


def check_settings(args: argparse.Namespace) -> None:
    """Reject bad settings before loading anything."""
    get_strategy(args.strategy)
    pick(EngineSettings, args).check()
    pick(GenerationLimits, args).check()
    if args.max_steps < 0:
        raise InputError(f"must be 0 or more, got {args.max_steps}", field="--max-steps")
    if args.n < 1:
        raise InputError(f"must be 1 or more, got {args.n}", field="--n")
    if args.budget is not None and args.budget < 1:
        raise InputError(f"must be a positive number of tokens, got {args.budget}", field="--budget")
    if args.max_active < 1:
        raise InputError(f"must be 1 or more, got {args.max_active}", field="--max-active")
    if args.task is not None:
        get_task(args.task, field="--task")


def strategy_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "max_steps": args.max_steps,
        "stop_bias": args.stop_bias,
        "final_docs": args.final_docs,
        "limits": pick(GenerationLimits, args),
    }
    if args.strategy == "best_of_n":
        kwargs["n"] = args.n
    return kwargs


def question_options(args: argparse.Namespace) -> dict[str, Any]:
    """What `load_examples` takes from the command line: the task, and 2Wiki's alias file."""
    return {"task": args.task, **({"aliases": args.aliases} if args.aliases else {})}


def done_ids(out: Path) -> set[str]:
    """Ids already written to `out`. A last line cut short by a crash is removed, so it is redone."""
    if not out.is_file():
        return set()
    data = out.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) != len(data):
        with out.open("r+b") as f:
            f.truncate(len(complete))
    ids = set()
    for line_no, line in enumerate(complete.decode().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            ids.add(str(json.loads(line)["query_id"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise InputError(
                "not a prediction record", file=str(out), line=line_no, field="query_id"
            ) from None
    return ids


def pending_examples(examples: Sequence[Example], done: set[str], data: str) -> list[Example]:
    """Questions not yet answered; duplicate ids in the input are an error (resuming relies on ids)."""
    seen: set[str] = set()
    for ex in examples:
        if ex.id in seen:
            raise InputError("duplicate question id", file=data, record=ex.id, field="id")
        seen.add(ex.id)
    return [ex for ex in examples if ex.id not in done]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_settings(args)
    from corag.data.corpus import Corpus
    from corag.data.formats import load_examples
    from corag.retrieval import load_retriever

    examples = load_examples(args.data, args.format, **question_options(args))[: args.limit]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    todo = pending_examples(examples, done_ids(out), args.data)
    print(f"{len(examples) - len(todo)} of {len(examples)} questions already in {out}; {len(todo)} to go")
    if not todo:
        return write_official(args, examples, out)
    corpus = Corpus.load(args.corpus)
    given = check_dataset_docs(todo, corpus, args.final_docs)
    print(
        f"final-answer documents: the data's context_doc_ids for {given} question(s), searched for the rest"
    )
    lm = pick(EngineSettings, args).load(args.model)
    retriever = load_retriever(args.index or args.retriever_url)
    strategy, kwargs = get_strategy(args.strategy), strategy_kwargs(args)
    executor = EXECUTORS[args.executor](lm, retriever, max_active=args.max_active)
    coros = (strategy(executor.context(args.budget), ex, corpus, **kwargs) for ex in todo)
    tokens = 0
    with out.open("a") as f, tqdm(total=len(todo), desc=f"predict {args.strategy}", unit="q") as bar:
        for _, result in executor.stream(coros):
            f.write(json.dumps(result.to_record(), ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
            tokens += result.usage.total
            bar.update()
            bar.set_postfix(tokens_per_q=tokens // bar.n)
    print(f"wrote {len(todo)} predictions to {out} (mean {tokens / len(todo):.0f} tokens per question)")
    return write_official(args, examples, out)


def write_official(args: argparse.Namespace, examples: Sequence[Example], out: Path) -> int:
    """With --official-files, the official inference's files for everything in `out`, beside it."""
    if not args.official_files:
        return 0
    from corag.evaluation import Run, read_predictions, write_official_files
    from corag.tasks import split_from_path

    run = Run(args.strategy, (("max_steps", args.max_steps),))
    records = read_predictions(out, examples, require_all=True)
    split = args.split or split_from_path(args.data) or "validation"
    paths = write_official_files(out.parent, run, examples, records, split)
    print(f"official files: {', '.join(str(p) for p in paths)}")
    return 0
