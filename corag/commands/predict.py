"""`corag predict`: run a decoding strategy over a question file and write predictions as JSONL.

Each line holds the official CoRAG prediction fields (query, answers, query_id, context_doc_ids,
subqueries, subanswers, predictions) and ours (strategy, steps with doc ids, usage, model calls, and
strategy extras). Lines are appended and flushed as questions finish; a re-run skips ids already in
the output, so an interrupted run resumes without loss or duplicates (as `corag evaluate` does: both
write through `corag.evaluation.run_method`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from corag.chain import GenerationLimits, check_dataset_docs
from corag.config import parse_config
from corag.data.jsonl import check_output, refuse_inputs_as_outputs
from corag.decoding import STRATEGIES, get_strategy
from corag.errors import InputError
from corag.evaluation import Run, check_resume, read_predictions, run_method, write_official_files
from corag.lm.settings import EngineSettings
from corag.options import DecodingArgs, QuestionsArgs, check_unique_ids
from corag.tasks import split_from_path


@dataclass
class PredictArgs:
    """Which strategy answers, with which settings, and where the predictions go."""

    _argument_group_name = "predict"

    out: str = field(metadata={"help": "predictions JSONL (appended; re-runs resume)"})
    strategy: str = field(default="greedy", metadata={"help": f"one of {sorted(STRATEGIES)}"})
    max_steps: int = field(default=6, metadata={"help": "chain length L (0: answer from documents only)"})
    n: int = field(default=4, metadata={"help": "chains for best_of_n"})
    stop_bias: float | None = field(
        default=None, metadata={"help": "learned stop with this logit bias on Yes"}
    )

    def check(self) -> None:
        get_strategy(self.strategy)
        if self.max_steps < 0:
            raise InputError(f"must be 0 or more, got {self.max_steps}", field="--max-steps")
        if self.n < 1:
            raise InputError(f"must be 1 or more, got {self.n}", field="--n")

    def run(self) -> Run:
        """The strategy and its settings as an evaluation run."""
        settings: list[tuple[str, object]] = [("max_steps", self.max_steps)]
        if self.strategy == "best_of_n":
            settings.append(("n", self.n))
        if self.stop_bias is not None:
            settings.append(("stop_bias", self.stop_bias))
        return Run(self.strategy, tuple(settings))


# The config dataclasses of `corag predict`, in the order parse_config returns them.
CONFIGS = (QuestionsArgs, DecodingArgs, PredictArgs, EngineSettings, GenerationLimits)


def main(argv: list[str] | None = None) -> int:
    questions, decoding, args, engine, limits = parse_config(
        CONFIGS,
        argv,
        __doc__.splitlines()[0],
    )
    args.check()
    for config in (engine, limits, decoding, questions):
        config.check()
    decoding.require("model", "corpus", "retriever")
    refuse_inputs_as_outputs({"--out": args.out}, [questions.data, decoding.corpus])
    check_output(args.out, "--out", keys=("query_id",))
    from corag.data.corpus import Corpus
    from corag.retrieval import check_corpus

    loaded, examples = questions.load()
    check_unique_ids(examples, questions.data)
    out = Path(args.out)
    done = check_resume(out, loaded, questions.data)
    todo = [ex for ex in examples if ex.id not in done]
    print(f"{len(examples) - len(todo)} of {len(examples)} questions already in {out}; {len(todo)} to go")
    run = args.run()
    if todo:
        corpus = Corpus.load(decoding.corpus)
        check_corpus(decoding.retriever, corpus)  # before the model loads
        given = check_dataset_docs(todo, corpus, decoding.final_docs)
        print(
            f"final-answer documents: the data's context_doc_ids for {given} question(s), searched for the rest"
        )
        lm, retriever = decoding.load(engine)
        records = run_method(
            run, examples, lm, retriever, corpus, out,
            budget=decoding.budget, max_active=decoding.max_active, executor=decoding.executor,
            extra_kwargs={"final_docs": decoding.final_docs, "limits": limits},
        )  # fmt: skip
        tokens = sum(r["usage"]["total_tokens"] for r in records if r["query_id"] not in done)
        print(f"wrote {len(todo)} predictions to {out} (mean {tokens / len(todo):.0f} tokens per question)")
    if decoding.official_files:
        records = read_predictions(out, examples, require_all=True)
        split = questions.split or split_from_path(questions.data) or "validation"
        paths = write_official_files(out.parent, run, examples, records, split)
        print(f"official files: {', '.join(str(p) for p in paths)}")
    return 0
