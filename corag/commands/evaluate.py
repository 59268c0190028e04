"""`corag evaluate`: run methods over a dataset, score their predictions, compare them by compute.

Each run (`greedy:L=3`, `best_of_n:L=2,4:N=2,4` is a grid of four) writes `<out_dir>/<run>/predictions.jsonl`
(appended per question, so an interrupted evaluation resumes; in question order once complete) and
`metrics.json`; `results.md`, `results.csv` and `scaling.png` hold every run in the folder (see
corag.evaluation). With `--predictions`, an existing prediction file (ours or the official inference's)
is scored instead.

Over many processes (evaluation/slurm_eval.sh), as `corag index` splits its encoding:

    corag evaluate ... --out-dir OUT --shard i --num-shards n   # part i: OUT/parts/part-i-of-n/<run>/
    corag evaluate ... --out-dir OUT --num-shards n --merge     # the parts -> OUT/<run>/, the table

A part answers a contiguous slice of the questions with every method; a finished part is skipped when
run again and an interrupted one resumes. The merge writes exactly the files one process writes (with
the stepped executor, the same predictions to the byte) and refuses, naming the file, while a part is
missing or unfinished.

Slurm's warning before the time limit (SIGUSR1, corag.cluster.stop) ends an evaluation or a part after the
question in hand: the predictions hold whole lines, the unfinished run no metrics, and the exit status is
75 (stopped), so that evaluation/slurm_eval.sh requeues the job; the rerun resumes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from corag.chain import GenerationLimits, check_dataset_docs
from corag.cluster.stop import StopRequest, stopped, warning_held
from corag.config import parse_config
from corag.data.jsonl import check_output, write_jsonl
from corag.errors import InputError
from corag.evaluation import (
    PARTS,
    RULE_CHOICES,
    Run,
    check_resume,
    eval_task,
    folder_results,
    merge_parts,
    official_strategy,
    page_lookup,
    parse_runs,
    part_finished,
    part_folder,
    part_questions,
    read_predictions,
    run_folder,
    run_method,
    score_records,
    unanswered,
    write_json,
    write_official_files,
    write_results,
)
from corag.kilt import read_page_ids, write_kilt_submission
from corag.lm.settings import EngineSettings
from corag.options import DecodingArgs, QuestionsArgs, settings_record
from corag.tasks import get_task, split_from_path
from corag.types import Example


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
    shard: int = field(
        default=0,
        metadata={"help": "which part of the questions to answer (0-based; with --num-shards): its files go "
        "to OUT/parts/, never the final ones"},
    )  # fmt: skip
    num_shards: int = field(
        default=1, metadata={"help": "parts the questions are split into (contiguous, sizes within one)"}
    )
    merge: bool = field(
        default=False,
        metadata={"help": "join the --num-shards parts into the runs' predictions, metrics and table "
        "(refused while a part is missing or unfinished)"},
    )  # fmt: skip

    def check(self) -> None:
        if self.num_shards < 1:
            raise InputError(f"must be 1 or more, got {self.num_shards}", field="--num-shards")
        if not 0 <= self.shard < self.num_shards:
            raise InputError(
                f"need 0 <= --shard < --num-shards, got {self.shard}/{self.num_shards}", field="--shard"
            )
        if self.merge and (self.shard or self.num_shards < 2):
            raise InputError(
                "joins every part of a run split with --num-shards N (2 or more); got "
                f"--shard {self.shard} --num-shards {self.num_shards}",
                field="--merge",
            )
        if self.predictions and (self.merge or self.num_shards > 1):
            raise InputError("scores one file: no --shard, --num-shards or --merge", field="--predictions")


# The config dataclasses of `corag evaluate`, in the order parse_config returns them.
CONFIGS = (QuestionsArgs, DecodingArgs, EvaluateArgs, EngineSettings, GenerationLimits)
# What `corag evaluate` writes in its folder (check_output's marks).
OUT_MARKS = ("metrics.json", "*/predictions.jsonl", "results.md", PARTS)
# Options that say how a run is split, not what it answers: left out of the settings in metrics.json,
# so that merged parts write the metrics one process writes.
SPLIT_OPTIONS = ("shard", "num_shards", "merge")


@dataclass
class Job:
    """One call of `corag evaluate`: its configs, runs and questions, and what scoring needs."""

    configs: tuple[Any, ...]
    runs: list[Run]
    loaded: list[Example]  # every question of the file (resume files are checked against these)
    examples: list[Example]  # the first --limit of them
    out_dir: Path
    split: str
    title_ids: dict[str, str] | None
    stop: StopRequest | None = None  # Slurm's warning: stop after the question in hand

    @property
    def args(self) -> EvaluateArgs:
        return self.configs[2]

    @property
    def kilt(self) -> bool:
        return any(get_task(e.task).is_kilt for e in self.examples)

    def settings(self) -> dict[str, Any]:
        return {k: v for k, v in settings_record(*self.configs).items() if k not in SPLIT_OPTIONS}


def main(argv: list[str] | None = None) -> int:
    stop = StopRequest().install()  # first: the warning may come while the configs and questions load
    configs = parse_config(
        CONFIGS,
        argv,
        __doc__.splitlines()[0],
    )
    questions, decoding, args, engine, limits = configs
    for config in (engine, limits, decoding, questions, args):
        config.check()
    runs = parse_runs(args.methods)  # every setting checked before any file is read
    check_output(args.out_dir, "--out-dir", marks=OUT_MARKS)
    loaded, examples = questions.load()
    job = Job(
        configs=configs,
        runs=runs,
        loaded=loaded,
        examples=examples,
        out_dir=Path(args.out_dir),
        split=questions.split or split_from_path(questions.data) or "validation",
        title_ids=read_page_ids(args.page_ids) if args.page_ids else None,
        stop=stop,
    )
    job.out_dir.mkdir(parents=True, exist_ok=True)
    if args.predictions:
        return score_file(job)
    if args.merge:
        return merge(job)
    if args.num_shards > 1:
        return answer_part(job)
    left = answer(job, job.examples, job.out_dir)
    if left:
        return stopped(f"{left}, in {job.out_dir}/<run>/")
    paths = write_results(folder_results(job.out_dir), job.out_dir)
    print(paths["table"].read_text())
    print(f"predictions and metrics in {job.out_dir}/<run>/; table {paths['table']}; plot {paths['plot']}")
    return stopped(f"every question in {job.out_dir}/<run>/") if stop.received else 0


def score_file(job: Job) -> int:
    """`--predictions`: score an existing prediction file."""
    from corag.data.corpus import Corpus

    questions, decoding, args = job.configs[:3]
    started = time.perf_counter()
    corpus = Corpus.load(decoding.corpus) if decoding.corpus else None
    records = read_predictions(
        Path(args.predictions), job.examples, require_all=args.require_all, known=(e.id for e in job.loaded)
    )
    summary = score_records(job.examples, records, args.rules, pages=page_lookup(corpus, job.title_ids))
    summary.update(eval_task=eval_task(job.examples), eval_split=job.split)
    summary.update(wall_seconds=round(time.perf_counter() - started, 3), settings=job.settings())
    write_json(job.out_dir / "metrics.json", summary)
    if job.kilt:
        ids = [e.id for e in job.examples]
        write_kilt_submission(job.out_dir / "kilt_submission.jsonl", ids, records, corpus, job.title_ids)
    print(json.dumps(summary, indent=2))
    print(f"metrics in {job.out_dir / 'metrics.json'}")
    return 0


def answer_part(job: Job) -> int:
    """`--shard i --num-shards n`: answer part i of the questions into its own folder; a finished part is
    left as it is (nothing loads)."""
    shard, n = job.args.shard, job.args.num_shards
    folder = part_folder(job.out_dir, shard, n)
    examples = part_questions(job.examples, shard, n)
    if not examples:
        print(f"part {shard} of {n}: no questions (the file has {len(job.examples)}); nothing to do")
        return 0
    if all(part_finished(run_folder(folder, run), examples) for run in job.runs):
        print(f"part {shard} of {n} already finished: {folder}")
        return 0
    left = answer(job, examples, folder, part=True)
    if left:
        return stopped(f"part {shard} of {n}, {left}, in {folder}/<run>/")
    print(f"part {shard} of {n} ({len(examples)} questions) in {folder}/<run>/; join the parts with --merge")
    # warned as it finished: no more work in this job (evaluation/slurm_eval.sh starts no other file)
    warned = job.stop is not None and job.stop.received
    return stopped(f"every question of part {shard} of {n} in {folder}/<run>/") if warned else 0


def answer(job: Job, examples: list[Example], out_dir: Path, *, part: bool = False) -> str | None:
    """Answer `examples` with every run into `out_dir/<run>/` (resuming), scoring each run; the model
    loads only when some question is still unanswered. A part writes predictions and metrics only.
    None once every run is done; when `job.stop` ended it first, what was saved (a run's answers so far)."""
    from corag.data.corpus import Corpus
    from corag.decoding import STRATEGIES
    from corag.retrieval import check_corpus

    questions, decoding, args, engine, limits = job.configs
    decoding.require("model", "corpus", "retriever")
    done = [  # resume files of another dataset: refused before the model loads
        check_resume(run_folder(out_dir, run) / "predictions.jsonl", job.loaded, questions.data)
        for run in job.runs
    ]
    todo = any(e.id not in ids for ids in done for e in examples)
    if todo and job.stop is not None and job.stop.received:  # warned before it began: load nothing
        return "no question (warned before anything loaded)"
    corpus = Corpus.load(decoding.corpus)
    check_corpus(decoding.retriever, corpus)  # before the model loads
    if any(run.method in STRATEGIES for run in job.runs):
        given = check_dataset_docs(examples, corpus, decoding.final_docs)
        print(
            f"final-answer documents: the data's context_doc_ids for {given} of {len(examples)} question(s)"
        )
    with warning_held():  # the engine's own processes never act on the warning; this one takes it after
        lm, retriever = decoding.load(engine) if todo else (None, None)
    extra: dict[str, Any] = {}
    if args.demonstrations:
        from corag.methods.demos import load_demonstrations

        extra["demonstrations"] = load_demonstrations(Path(args.demonstrations))
    pages = page_lookup(corpus, job.title_ids)
    for i, run in enumerate(job.runs):
        folder = run_folder(out_dir, run)
        if job.stop is not None and job.stop.received and unanswered(folder / "predictions.jsonl", examples):
            return f"{i} of {len(job.runs)} run(s) done, the next not started"
        run_started = time.perf_counter()
        method_extra = extra if run.method in ("ircot", "one_step", "no_retrieval") else {}
        if run.method in STRATEGIES:
            method_extra = {"final_docs": decoding.final_docs, "limits": limits}
        records = run_method(
            run, examples, lm, retriever, corpus, folder / "predictions.jsonl",
            budget=decoding.budget, max_active=decoding.max_active, extra_kwargs=method_extra,
            executor=decoding.executor, stop=job.stop,
        )  # fmt: skip
        if records is None:
            answered = len(examples) - len(unanswered(folder / "predictions.jsonl", examples))
            return f"run {run.name}: {answered} of {len(examples)} question(s) answered"
        seconds = time.perf_counter() - run_started
        write_run(job, run, folder, examples, records, seconds, corpus, pages, files=not part)
    return None


def merge(job: Job) -> int:
    """`--merge`: join every run's parts into its folder, as one process writes it, then the table.
    Every part of every run is checked before anything is written."""
    from corag.data.corpus import Corpus

    n = job.args.num_shards
    merged = []
    for run in job.runs:
        folders = [run_folder(part_folder(job.out_dir, i, n), run) for i in range(n)]
        merged.append((run, *merge_parts(folders, job.examples)))
    corpus = Corpus.load(job.configs[1].corpus) if job.configs[1].corpus else None
    pages = page_lookup(corpus, job.title_ids)
    for run, records, seconds in merged:
        folder = run_folder(job.out_dir, run)
        write_jsonl(folder / "predictions.jsonl", records)
        write_run(job, run, folder, job.examples, records, seconds, corpus, pages)
    paths = write_results(folder_results(job.out_dir), job.out_dir)
    print(paths["table"].read_text())
    print(f"merged {n} parts: predictions and metrics in {job.out_dir}/<run>/; table {paths['table']}")
    return 0


def write_run(
    job: Job,
    run: Run,
    folder: Path,
    examples: list[Example],
    records: list[dict[str, Any] | None],
    seconds: float,
    corpus: Any,
    pages: Any,
    *,
    files: bool = True,
) -> None:
    """A run's metrics.json and, with `files`, its official files (--official-files) and KILT submission."""
    from corag.decoding import STRATEGIES

    args, decoding = job.args, job.configs[1]
    summary = score_records(examples, records, args.rules, pages=pages)
    summary.update(eval_task=eval_task(examples), eval_split=job.split)
    if run.method in STRATEGIES:
        strategy, length = official_strategy(run)
        summary.update(decode_strategy=strategy, max_path_length=length)
        if decoding.official_files and files:
            write_official_files(folder, run, examples, records, job.split)
    summary.update(
        run=run.name,
        wall_seconds=round(seconds, 3),
        finished_at=datetime.now(timezone.utc).isoformat(),
        settings={"method": run.method, "method_settings": dict(run.kwargs), **job.settings()},
    )
    write_json(folder / "metrics.json", summary)
    if job.kilt and files:
        ids = [e.id for e in examples]
        write_kilt_submission(folder / "kilt_submission.jsonl", ids, records, corpus, job.title_ids)
