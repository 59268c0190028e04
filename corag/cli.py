"""The `corag` command: one short entry point per stage, each implemented in its own module."""

from __future__ import annotations

import importlib
import sys

# command -> "module:function"; each function takes argv (list[str]) and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "quickstart": ("corag.quickstart:main", "build, sample, train and evaluate on the toy world"),
    "toyworld": ("corag.data.toyworld:main", "write a toy world (corpus and questions) to a folder"),
    "corpus": ("corag.data.corpus:main", "prepare a corpus store once (JSONL, parquet, datasets folder)"),
    "models": ("corag.models:main", "convert the packaged SmolLM2-135M-Instruct into a checkpoint folder"),
    "index": ("corag.retrieval.index:main", "dense (encoded, sharded or imported) or BM25 index of a corpus"),
    "serve-retriever": ("corag.retrieval.service:main", "serve an index over HTTP for many workers"),
    "predict": ("corag.decoding.predict:main", "run a decoding strategy over a dataset"),
    "sample": ("corag.sampling:main", "rejection-sample chains (also sampling/sample.py)"),
    "merge": ("corag.sampling:merge_main", "merge sampling shards, checking ids"),
    "evaluate": ("corag.evaluation:main", "evaluate predictions or a checkpoint (also evaluation/)"),
    "kilt-score": ("corag.kilt:main", "validate and score a KILT submission file"),
    "demos": ("corag.methods.demos:main", "build IRCoT demonstrations (MuSiQue or toy world)"),
    "warmstart": ("corag.warmstart:main", "write warm-start examples from fresh toy worlds"),
    "toystudy": ("corag.toystudy:main", "the full toy-world study (see benchmarks/toyworld.py)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"} or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
        print("usage: corag COMMAND [ARGS]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in {"-h", "--help"} else 2
    target, _ = COMMANDS[argv[0]]
    module, func = target.split(":")
    return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
