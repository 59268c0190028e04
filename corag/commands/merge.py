"""`corag merge SHARD... --questions Q --out merged.jsonl`: join sampling shards, checking every id."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from corag.config import parse_config
from corag.data.jsonl import check_output, refuse_inputs_as_outputs
from corag.errors import InputError
from corag.sampling import merge_shards, validate_questions


@dataclass
class MergeArgs:
    shards: list[str] = field(metadata={"positional": True, "help": "shard files of one sampling run"})
    questions: str = field(metadata={"help": "the questions file the shards were sampled from"})
    out: str = field(metadata={"help": "merged chains JSONL"})
    format: str | None = field(default=None, metadata={"help": "questions format (detected when not given)"})
    task: str | None = field(default=None, metadata={"help": "as given to `corag sample`"})
    skip_invalid: bool = field(default=False, metadata={"help": "as given to `corag sample`"})
    corpus: str | None = field(
        default=None, metadata={"help": "needed with --skip-invalid to re-check corpus ids"}
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_config(MergeArgs, argv, __doc__.splitlines()[0])
    refuse_inputs_as_outputs({"--out": args.out}, [args.questions, *args.shards])
    check_output(args.out, "--out", keys=("query_id",))
    from corag.data.formats import load_examples

    examples = load_examples(
        args.questions, args.format, task=args.task, **({"errors": []} if args.skip_invalid else {})
    )
    if args.skip_invalid:
        from corag.data.corpus import Corpus

        if args.corpus is None:
            raise InputError("--skip-invalid needs the corpus to re-check ids", field="--corpus")
        examples, _ = validate_questions(examples, Corpus.load(args.corpus), args.questions, True)
    shards = [Path(s) for s in args.shards]
    n = merge_shards(shards, examples, Path(args.out))
    print(f"merged {n} records from {len(shards)} shard(s) into {args.out}")
    return 0
