"""`corag sample` (also sampling/sample.py): one shard of a rejection-sampling run (corag.sampling).

The chains a run produces are decided by the sampling settings, the model, the questions, the index and
the rendering and generation limits; all of them are hashed into every record, so a shard resumes only
a run of the same settings, wherever its files have moved.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from corag.chain import GenerationLimits
from corag.cluster.stop import StopRequest, stopped
from corag.config import parse_config
from corag.data.jsonl import check_output
from corag.errors import InputError
from corag.executor import EXECUTORS
from corag.lm.settings import EngineSettings
from corag.options import chain_settings
from corag.sampling import (
    SamplingConfig,
    model_fingerprint,
    questions_fingerprint,
    run_sampling,
    shard_path,
    validate_questions,
)


@dataclass
class SampleArgs:
    """Where the questions, model and retriever are, and which shard of the run this is."""

    _argument_group_name = "sample"

    model: str = field(default="", metadata={"help": "HF chat model folder or hub name (any chat model)"})
    questions: str = field(default="", metadata={"help": "training questions (any supported format)"})
    corpus: str = field(default="", metadata={"help": "corpus (.jsonl, .parquet, .arrow, datasets folder)"})
    retriever: str = field(default="", metadata={"help": "index folder from `corag index`, or a service URL"})
    index_devices: str | None = field(
        default=None,
        metadata={
            "help": "GPUs of a dense index folder's fp16 shards: cuda:0-3, cuda:0,1 or cpu (default: every visible GPU); a service URL holds its own"
        },
    )
    out_dir: str = field(default="runs/chains", metadata={"help": "folder of shard files"})
    format: str | None = field(default=None, metadata={"help": "questions format (detected when not given)"})
    task: str | None = field(
        default=None,
        metadata={"help": "task of the questions (default: the records' own, else the file name's)"},
    )
    aliases: str | None = field(default=None, metadata={"help": "2WikiMultihopQA id_aliases.json"})
    block_size: int = field(
        default=64,
        metadata={"help": "questions sampled together; shards and resumes work in whole blocks, so the "
        "output does not depend on either"},
    )  # fmt: skip
    shard: int = 0
    num_shards: int = 1
    executor: str = field(
        default="stepped",
        metadata={"help": f"one of {sorted(EXECUTORS)}. stepped: one block at a time as one batch (the same "
        "chains to the bit however the run is sharded or resumed); async: questions stream through with "
        "block_size in flight and no barrier between blocks (with the vllm-async backend, calls join the "
        "running batch)"},
    )  # fmt: skip
    skip_invalid: bool = field(default=False, metadata={"help": "skip (and count) invalid questions"})
    limit: int | None = field(default=None, metadata={"help": "only the first N questions"})


# The config dataclasses of `corag sample`, in the order parse_config returns them.
CONFIGS = (SamplingConfig, SampleArgs, EngineSettings, GenerationLimits)


def main(argv: list[str] | None = None) -> int:
    sampling, args, engine, limits = parse_config(CONFIGS, argv, __doc__.splitlines()[0])
    for name in ("model", "questions", "corpus", "retriever"):
        if not getattr(args, name):
            raise InputError("required to sample", field=f"--{name}")
    if not 0 <= args.shard < args.num_shards:
        raise InputError(
            f"need 0 <= --shard < --num-shards, got {args.shard}/{args.num_shards}", field="--shard"
        )
    for config in (sampling, engine, limits):
        config.check()
    if args.limit is not None and args.limit < 1:
        raise InputError(f"must be 1 or more, got {args.limit}", field="--limit")
    out_path = shard_path(Path(args.out_dir), args.shard, args.num_shards)
    check_output(args.out_dir, "--out_dir", marks=("*",))  # a folder; its other files are left alone
    check_output(out_path, "--out_dir", keys=("query_id",))
    from corag.data.corpus import Corpus
    from corag.data.formats import load_examples
    from corag.retrieval import check_corpus, index_fingerprint, load_retriever

    corpus = Corpus.load(args.corpus)
    errors: list[InputError] = []
    options = {"task": args.task, **({"aliases": args.aliases} if args.aliases else {})}
    examples = load_examples(
        args.questions, args.format, **options, **({"errors": errors} if args.skip_invalid else {})
    )
    questions_id = questions_fingerprint(examples)  # before --limit: a longer run resumes a shorter one
    if args.limit is not None:
        examples = examples[: args.limit]
    examples, skipped = validate_questions(examples, corpus, args.questions, args.skip_invalid, errors)
    if skipped:
        print(f"skipped {sum(skipped.values())} invalid question(s): {dict(skipped)}", file=sys.stderr)
    from corag.plan import check_visible

    check_visible("sample", {**dataclasses.asdict(args), **dataclasses.asdict(engine)})
    check_corpus(args.retriever, corpus)  # before the model loads
    lm = engine.load(args.model)
    retriever = load_retriever(args.retriever, index_devices=args.index_devices)
    # The resume hash names what changes the chains, not where things live: a moved checkpoint,
    # questions file, index folder or service URL resumes the same run.
    index_id = (
        retriever.fingerprint() if hasattr(retriever, "fingerprint") else index_fingerprint(args.retriever)
    )
    stop = StopRequest().install()  # Slurm's warning before the time limit: stop after the block in hand
    summary = run_sampling(
        examples,
        corpus,
        lm,
        retriever,
        sampling,
        out_path,
        hash_inputs={
            "model": model_fingerprint(args.model),
            "questions": questions_id,
            "retriever": index_id,
            **chain_settings(engine, limits),
        },
        limits=limits,
        block_size=args.block_size,
        shard=args.shard,
        num_shards=args.num_shards,
        executor=args.executor,
        stop=stop,
    )
    summary["skipped_invalid"] = dict(skipped)
    print(json.dumps(summary, indent=2))
    print(f"chains written to {out_path}")
    return stopped(f"{summary['chains_kept']} question(s) in {out_path}") if summary["stopped"] else 0
