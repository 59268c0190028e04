"""`corag corpus SUBCOMMAND`: corpus stores.

corag corpus prepare SOURCE [--out STORE]            # convert a corpus source into its store once
corag corpus from-contexts DATA... --out CORPUS      # a corpus of the questions' own paragraphs
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corag.config import ConfigParser, parse_config
from corag.data.corpus import Corpus, prepare_corpus, write_context_corpus

# A subcommand: (its config dataclass, the function that runs it, its help line).
Subcommands = dict[str, tuple[type, Callable[[Any], int], str]]


def run_subcommand(prog: str, description: str, subcommands: Subcommands, argv: list[str] | None) -> int:
    """Run `PROG SUBCOMMAND [OPTIONS]`: argparse picks the subcommand (and answers `PROG --help`), then
    the subcommand's options are parsed into its own config dataclass."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = ConfigParser(prog=prog, description=description)  # a wrong subcommand: one InputError line
    sub = parser.add_subparsers(dest="subcommand", required=True)
    for name, (_, _, help_) in subcommands.items():
        sub.add_parser(name, help=help_, add_help=False)
    name = parser.parse_args(argv[:1]).subcommand
    config_class, run, help_ = subcommands[name]
    program, sys.argv[0] = sys.argv[0], f"{prog} {name}"  # the usage line names the subcommand
    try:
        return run(parse_config(config_class, argv[1:], help_))
    finally:
        sys.argv[0] = program


@dataclass
class PrepareConfig:
    """A corpus source and where its store goes."""

    source: str = field(
        metadata={
            "positional": True,
            "help": "corpus.jsonl, a .parquet file, a folder of parquet files, a saved dataset",
        }
    )
    out: str | None = field(
        default=None, metadata={"help": "store folder (default: SOURCE.corag beside the source)"}
    )
    cache_dir: str | None = field(
        default=None, metadata={"help": "put the store here when --out is not given"}
    )
    overwrite: bool = field(default=False, metadata={"help": "rebuild even if an up-to-date store exists"})


@dataclass
class FromContextsConfig:
    """Question files with context paragraphs, and where the corpus and the questions go."""

    data: list[str] = field(
        metadata={
            "positional": True,
            "nargs": "+",
            "help": "question files whose records carry context paragraphs",
        }
    )
    out: str = field(metadata={"help": "corpus JSONL to write"})
    questions: str | None = field(
        default=None,
        metadata={
            "help": "questions JSONL to write, with supporting_ids (default: <corpus stem>.questions.jsonl "
            "beside it)"
        },
    )


def prepare(args: PrepareConfig) -> int:
    start = time.perf_counter()
    store = prepare_corpus(args.source, args.out, cache_dir=args.cache_dir, overwrite=args.overwrite)
    corpus = Corpus(store)
    size = sum(p.stat().st_size for p in store.iterdir())
    print(f"{len(corpus)} passages in {store} ({size / 2**30:.2f} GiB, {time.perf_counter() - start:.1f} s)")
    return 0


def from_contexts(args: FromContextsConfig) -> int:
    start = time.perf_counter()
    built, questions = write_context_corpus(args.data, args.out, args.questions)
    with_gold = sum(bool(e.supporting_ids) for e in built.examples)
    print(
        f"{len(built.ids)} passages in {built.path}; {len(built.examples)} questions in {questions} "
        f"({with_gold} with gold passage ids; {time.perf_counter() - start:.1f} s)"
    )
    return 0


SUBCOMMANDS: Subcommands = {
    "from-contexts": (
        FromContextsConfig,
        from_contexts,
        "a corpus of the context paragraphs of HotpotQA, 2Wiki or MuSiQue files, and their questions "
        "with gold passage ids",
    ),
    "prepare": (PrepareConfig, prepare, "convert JSONL, parquet (file or folder), Arrow or a saved dataset"),
}


def main(argv: list[str] | None = None) -> int:
    return run_subcommand("corag corpus", "corpus stores: prepare one from a source", SUBCOMMANDS, argv)
