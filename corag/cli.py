"""The `corag` command: one short entry point per stage, each implemented in its own module.

Bad input (an `InputError`) ends a command with its one-line message on stderr and exit status 2;
`corag --debug COMMAND ...` or `CORAG_DEBUG=1` shows the traceback instead.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable

from corag.errors import InputError

# command -> "module:function"; each function takes argv (list[str]) and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "quickstart": ("corag.commands.quickstart:main", "build, sample, train and evaluate on the toy world"),
    "toyworld": ("corag.commands.toyworld:main", "write a toy world (corpus and questions) to a folder"),
    "corpus": ("corag.commands.corpus:main", "prepare a corpus store once (JSONL, parquet, datasets folder)"),
    "prepare-data": (
        "corag.commands.prepare_data:main",
        "the released question sets (hf download corag/multihopqa, corag/kilt) into questions files",
    ),
    "models": (
        "corag.commands.models:main",
        "the packaged SmolLM2-135M-Instruct as a checkpoint; fetch the configs' models into the cache",
    ),
    "index": ("corag.commands.index:main", "dense (encoded, sharded or imported) or BM25 index of a corpus"),
    "serve-retriever": ("corag.commands.serve_retriever:main", "serve an index over HTTP for many workers"),
    "plan": (
        "corag.commands.plan:main",
        "memory plan of a stage's config on some GPUs (refuses what cannot fit)",
    ),
    "smoke": (
        "corag.commands.smoke:main",
        "every stage small on this node with your configs, measured against the plan (smoke.json, smoke.md)",
    ),
    "predict": ("corag.commands.predict:main", "run a decoding strategy over a dataset"),
    "sample": ("corag.commands.sample:main", "rejection-sample chains (also sampling/sample.py)"),
    "merge": ("corag.commands.merge:main", "merge sampling shards, checking ids"),
    "build-examples": (
        "corag.commands.build_examples:main",
        "turn chains into the SFT examples dataset (Arrow), once",
    ),
    "train": (
        "corag.commands.train:main",
        "run a training recipe: `corag train sft|grpo --config FILE` (also accelerate launch -m corag.recipes.sft)",
    ),
    "iterate": (
        "corag.commands.iterate:main",
        "iterated rejection sampling: rounds of sample, train and evaluate, each round's model sampling the next",
    ),
    "submit": (
        "corag.commands.submit:main",
        "sbatch a launcher once some node of the partition can run it (CPUs, memory, GPUs a node)",
    ),
    "evaluate": ("corag.commands.evaluate:main", "evaluate predictions or a checkpoint (also evaluation/)"),
    "results": ("corag.commands.results:main", "one table over evaluations of several datasets"),
    "kilt-score": ("corag.commands.kilt_score:main", "validate and score a KILT submission file"),
    "kilt-pages": (
        "corag.commands.kilt_pages:main",
        "map page titles to Wikipedia ids (KILT knowledge source)",
    ),
    "demos": ("corag.commands.demos:main", "build IRCoT demonstrations (MuSiQue or toy world)"),
    "warmstart": ("corag.commands.warmstart:main", "write warm-start examples from fresh toy worlds"),
    "toystudy": ("corag.commands.toystudy:main", "the full toy-world study (see benchmarks/toyworld.py)"),
}

DEBUG_ENV = "CORAG_DEBUG"


def run_command(
    name: str, func: Callable[[list[str]], int | None], argv: list[str], debug: bool = False
) -> int:
    """Run one command; an InputError becomes one line on stderr and exit status 2 (unless debugging),
    and what the command created beside its inputs (a corpus store) is removed first."""
    from corag.data.jsonl import removed_if_refused

    try:
        with removed_if_refused():
            return int(func(argv) or 0)
    except InputError as error:
        if debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        message = " ".join(str(error).split())  # one line, whatever the message held
        print(f"corag {name}: error: {message}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = bool(argv) and argv[0] == "--debug"
    argv = argv[1:] if debug else argv
    if argv and argv[0] not in {"-h", "--help", *COMMANDS}:
        close = difflib.get_close_matches(argv[0], COMMANDS, n=1)
        hint = f"did you mean {close[0]}?" if close else "`corag --help` lists the commands"
        print(f"corag: error: unknown command {argv[0]!r}; {hint}", file=sys.stderr)
        return 2
    if not argv or argv[0] in {"-h", "--help"}:
        width = max(map(len, COMMANDS))
        lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
        print(
            "usage: corag [--debug] COMMAND [ARGS]\n\ncommands:\n"
            + "\n".join(lines)
            + f"\n\n--debug (or {DEBUG_ENV}=1) shows the traceback of a bad-input error"
        )
        return 0 if argv else 2
    target, _ = COMMANDS[argv[0]]
    module, func = target.split(":")
    program, sys.argv[0] = sys.argv[0], f"corag {argv[0]}"  # argparse's usage line names the command
    try:
        return run_command(argv[0], getattr(importlib.import_module(module), func), argv[1:], debug)
    finally:
        sys.argv[0] = program


if __name__ == "__main__":
    sys.exit(main())
