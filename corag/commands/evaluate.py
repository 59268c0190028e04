"""`corag evaluate`: run methods over a dataset, score their predictions, compare them by compute.

Each run (`greedy:L=3`, `best_of_n:L=2,4:N=2,4` is a grid of four) writes `<out_dir>/<run>/predictions.jsonl`
(appended per question, so an interrupted evaluation resumes) and `metrics.json`; `results.md`,
`results.csv` and `scaling.png` hold every run in the folder (see corag.evaluation). With `--predictions`,
an existing prediction file (ours or the official inference's) is scored instead.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from corag.chain import GenerationLimits, check_dataset_docs
from corag.commands.common import DecodingArgs, QuestionsArgs, settings_record
from corag.config import parse_config
from corag.data.jsonl import check_output
from corag.evaluation import (
    RULE_CHOICES,
    Run,
    check_resume,
    eval_task,
    folder_results,
    official_strategy,
    page_lookup,
    parse_runs,
    read_predictions,
    run_method,
    score_records,
    write_json,
    write_official_files,
    write_results,
)
from corag.kilt import read_page_ids, write_kilt_submission
from corag.lm.settings import EngineSettings
from corag.tasks import get_task, split_from_path


@dataclass
class EvaluateArgs:
    """What to run or score, how answers are scored, and where results go."""

    _argument_group_name = "evaluate"

    out_dir: str = field(metadata={"help": "folder of runs, tables and plot"})
    methods: list[str] = field(
        default_factory=lambda: ["greedy:L=3"],
        metadata={"help": "runs as method[:key=v1,v2]...; grids expand (e.g. best_of_n:L=2,4:N=2,4)"},
    )
    rules: str = field(
        default="official",
        metadata={"choices": list(RULE_CHOICES), "help": "answer scoring: each benchmark's official script "
        "(official), the CoRAG paper's SQuAD EM/F1 everywhere (corag), Search-R1's EM (search-r1), or one "
        "rule for all"},
    )  # fmt: skip
    predictions: str | None = field(
        default=None, metadata={"help": "score this prediction file (ours or official) instead"}
    )
    require_all: bool = field(
        default=False, metadata={"help": "refuse predictions missing questions (default: they count 0)"}
    )
    demonstrations: str | None = field(
        default=None, metadata={"help": "IRCoT demonstrations JSONL (for ircot and baselines)"}
    )
    page_ids: str | None = field(
        default=None,
        metadata={"help": "KILT: JSON map of page title -> Wikipedia id (`corag kilt-pages` builds it)"},
    )


# The config dataclasses of `corag evaluate`, in the order parse_config returns them.
CONFIGS = (QuestionsArgs, DecodingArgs, EvaluateArgs, EngineSettings, GenerationLimits)


def run_folder(out_dir: Path, run: Run) -> Path:
    """Where a run writes: its name, as a folder name."""
    return out_dir / run.name.replace(":", "_").replace("=", "")


def main(argv: list[str] | None = None) -> int:
    configs = parse_config(
        CONFIGS,
        argv,
        __doc__.splitlines()[0],
    )
    questions, decoding, args, engine, limits = configs
    for config in (engine, limits, decoding, questions):
        config.check()
    runs = parse_runs(args.methods)  # every setting checked before any file is read
    check_output(args.out_dir, "--out-dir", marks=("metrics.json", "*/predictions.jsonl", "results.md"))
    from corag.data.corpus import Corpus

    loaded, examples = questions.load()
    split = questions.split or split_from_path(questions.data) or "validation"
    kilt = any(get_task(e.task).is_kilt for e in examples)
    title_ids = read_page_ids(args.page_ids) if args.page_ids else None
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.predictions:
        corpus = Corpus.load(decoding.corpus) if decoding.corpus else None
        records = read_predictions(
            Path(args.predictions), examples, require_all=args.require_all, known=(e.id for e in loaded)
        )
        summary = score_records(examples, records, args.rules, pages=page_lookup(corpus, title_ids))
        summary.update(eval_task=eval_task(examples), eval_split=split)
        summary.update(
            wall_seconds=round(time.perf_counter() - started, 3), settings=settings_record(*configs)
        )
        write_json(out_dir / "metrics.json", summary)
        if kilt:
            ids = [e.id for e in examples]
            write_kilt_submission(out_dir / "kilt_submission.jsonl", ids, records, corpus, title_ids)
        print(json.dumps(summary, indent=2))
        print(f"metrics in {out_dir / 'metrics.json'}")
        return 0
    decoding.require("model", "corpus", "retriever")
    from corag.decoding import STRATEGIES
    from corag.retrieval import check_corpus

    corpus = Corpus.load(decoding.corpus)
    check_corpus(decoding.retriever, corpus)  # before the model loads
    if any(run.method in STRATEGIES for run in runs):
        given = check_dataset_docs(examples, corpus, decoding.final_docs)
        print(
            f"final-answer documents: the data's context_doc_ids for {given} of {len(examples)} question(s)"
        )
    for run in runs:  # resume files of another dataset: refused before the model loads
        check_resume(run_folder(out_dir, run) / "predictions.jsonl", loaded, questions.data)
    lm, retriever = decoding.load(engine)
    extra: dict[str, Any] = {}
    if args.demonstrations:
        from corag.methods.demos import load_demonstrations

        extra["demonstrations"] = load_demonstrations(Path(args.demonstrations))
    pages = page_lookup(corpus, title_ids)
    for run in runs:
        run_started = time.perf_counter()
        folder = run_folder(out_dir, run)
        method_extra = extra if run.method in ("ircot", "one_step", "no_retrieval") else {}
        if run.method in STRATEGIES:
            method_extra = {"final_docs": decoding.final_docs, "limits": limits}
        records = run_method(
            run, examples, lm, retriever, corpus, folder / "predictions.jsonl",
            budget=decoding.budget, max_active=decoding.max_active, extra_kwargs=method_extra,
            executor=decoding.executor,
        )  # fmt: skip
        summary = score_records(examples, records, args.rules, pages=pages)
        summary.update(eval_task=eval_task(examples), eval_split=split)
        if run.method in STRATEGIES:
            strategy, length = official_strategy(run)
            summary.update(decode_strategy=strategy, max_path_length=length)
            if decoding.official_files:
                write_official_files(folder, run, examples, records, split)
        summary.update(
            run=run.name,
            wall_seconds=round(time.perf_counter() - run_started, 3),
            finished_at=datetime.now(timezone.utc).isoformat(),
            settings={"method": run.method, "method_settings": dict(run.kwargs), **settings_record(*configs)},
        )
        write_json(folder / "metrics.json", summary)
        if kilt:
            ids = [e.id for e in examples]
            write_kilt_submission(folder / "kilt_submission.jsonl", ids, records, corpus, title_ids)
    paths = write_results(folder_results(out_dir), out_dir)
    print(paths["table"].read_text())
    print(f"predictions and metrics in {out_dir}/<run>/; table {paths['table']}; plot {paths['plot']}")
    return 0
