"""`corag demos`: write an IRCoT demonstrations file built from MuSiQue or from a toy-world folder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from corag.config import parse_config
from corag.data.jsonl import check_output
from corag.errors import InputError
from corag.methods.demos import demos_from_examples, demos_from_musique, write_demonstrations


@dataclass
class DemosConfig:
    """Where the demonstrations come from (one of musique and toy), how many, and where they go."""

    out: str = field(metadata={"help": "the demonstrations JSONL to write"})
    musique: str | None = field(
        default=None, metadata={"help": "a MuSiQue JSONL file (decompositions and paragraphs)"}
    )
    toy: str | None = field(
        default=None, metadata={"help": "a toy-world folder (train.jsonl and corpus.jsonl)"}
    )
    n: int = field(default=15, metadata={"aliases": ["-n"], "help": "number of demonstrations"})
    distractors: list[int] = field(
        default_factory=lambda: [1, 3], metadata={"help": "MIN MAX distractor paragraphs per demonstration"}
    )
    seed: int = 0


def main(argv: list[str] | None = None) -> int:
    args = parse_config(DemosConfig, argv, __doc__.splitlines()[0])
    check_output(args.out, "--out", keys=("question", "answer"))
    if (args.musique is None) == (args.toy is None):
        raise InputError("give one of --musique and --toy", field="--musique")
    if len(args.distractors) != 2:
        raise InputError(f"expected two numbers, MIN MAX, got {args.distractors}", field="--distractors")
    distractors = (args.distractors[0], args.distractors[1])
    if args.musique is not None:
        demos = demos_from_musique(args.musique, args.n, distractors, args.seed)
    else:
        from corag.data.corpus import Corpus
        from corag.data.formats import load_examples
        from corag.retrieval.bm25 import BM25Retriever

        toy = Path(args.toy)
        corpus = Corpus.load(toy / "corpus.jsonl")
        retriever = BM25Retriever.build(corpus.iter_batches())
        examples = load_examples(toy / "train.jsonl", fmt="jsonl")
        demos = demos_from_examples(examples, corpus, args.n, distractors, retriever, args.seed)
    write_demonstrations(args.out, demos)
    print(f"wrote {len(demos)} demonstrations to {args.out}")
    return 0
