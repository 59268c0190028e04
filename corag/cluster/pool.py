"""The pool stage of a `corag iterate` round as a job of its own (sampling/slurm_pool.sh, `launcher: slurm`):
the round's sampler, loaded with the sampling config's engine settings, scores the earlier rounds' chains
again, and the best chain per question over the rounds becomes the round's training set
(corag.iterate.pool_chains; the local launcher runs the same function in process).

    python -m corag.cluster.pool SAMPLING_CONFIG --model SAMPLER --questions Q --corpus C [--limit N] \
        --out POOL ROUND=CHAINS [ROUND=CHAINS ...]   # rounds oldest first; the last is the round's own

The earlier chains' new scores go to POOL's `.scores.jsonl` file as they come: on Slurm's warning it stops
(exit status 75) and a rerun goes on from there; the file is removed once the pool is written.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from corag.cluster.stop import StopRequest, stopped
from corag.commands.sample import CONFIGS as SAMPLE_CONFIGS
from corag.config import parse_config
from corag.errors import InputError


@dataclass
class PoolArgs:
    config: str = field(
        metadata={"positional": True, "help": "the sampling config: scoring prompt and engine settings"}
    )
    chains: list[str] = field(
        metadata={"positional": True, "help": "ROUND=FILE, oldest round first; the last is the round's own"}
    )
    model: str = field(metadata={"help": "the round's sampler, which scores the earlier rounds' chains"})
    questions: str = field(metadata={"help": "the training questions the chains answer"})
    corpus: str = field(metadata={"help": "the corpus (documents of a scoring prompt with documents)"})
    out: str = field(metadata={"help": "the pool, JSONL"})
    limit: int | None = field(default=None, metadata={"help": "only the first N questions"})


def round_files(words: list[str]) -> dict[int, Path]:
    """ROUND=FILE words as {round: file}, oldest first; a word of another shape is refused."""
    files: dict[int, Path] = {}
    for word in words:
        k, eq, path = word.partition("=")
        if not eq or not k.isdigit() or not Path(path).is_file():
            raise InputError(f"expected ROUND=FILE of an existing file, got {word!r}", field="chains")
        files[int(k)] = Path(path)
    if list(files) != sorted(files):
        raise InputError(f"give the rounds oldest first, got {list(files)}", field="chains")
    return files


def main(argv: list[str] | None = None) -> int:
    stop = StopRequest().install()  # Slurm's warning before the time limit: keep what was scored, stop
    args = parse_config(PoolArgs, argv, __doc__.splitlines()[0])
    files = round_files(args.chains)
    # The sampling config as `corag sample` reads it: the scoring prompt and the engine settings.
    sampling, _, engine, _ = parse_config(SAMPLE_CONFIGS, ["--config", args.config])
    sampling.check()
    from corag.data.corpus import Corpus
    from corag.data.formats import load_examples
    from corag.iterate import pool_chains

    questions = load_examples(args.questions)[: args.limit]
    corpus = Corpus.load(args.corpus)
    out = Path(args.out)
    if not pool_chains(
        files, questions, corpus, args.model, engine.load, sampling.scoring_prompt, out, stop=stop
    ):
        return stopped(f"the earlier rounds' chains scored so far, beside {out}")
    print(f"pool of {len(files)} round(s) written to {args.out}")
    return 0


if __name__ == "__main__":
    from corag.cli import run_command

    sys.exit(run_command("pool", main, sys.argv[1:]))
