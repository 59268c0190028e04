"""`corag warmstart`: write warm-start examples from fresh toy worlds as JSONL."""

from __future__ import annotations

from dataclasses import dataclass, field

from corag.config import parse_config
from corag.data.jsonl import check_output, write_jsonl
from corag.errors import InputError
from corag.toy.warmstart import WarmStartConfig, iter_examples


@dataclass
class WarmstartArgs:
    """Where to write, which fresh worlds, and how many examples of each call one world gives."""

    out: str = field(metadata={"help": "output JSONL (prompt/completion examples)"})
    seed: int = 0
    worlds: int = field(default=50, metadata={"help": "fresh worlds to draw examples from"})
    exclude: list[int] = field(default_factory=list, metadata={"help": "world seeds never to use"})
    reading_per_world: int = WarmStartConfig.reading_per_world
    subquery_questions_per_world: int = WarmStartConfig.subquery_questions_per_world
    final_per_world: int = WarmStartConfig.final_per_world


def main(argv: list[str] | None = None) -> int:
    """`corag warmstart --out FILE --seed N --worlds W`: write warm-start examples as JSONL."""
    args = parse_config(WarmstartArgs, argv, description=main.__doc__)
    check_output(args.out, "--out", keys=("prompt", "completion"))
    if args.worlds < 1:
        raise InputError(f"must be 1 or more, got {args.worlds}", field="--worlds")
    config = WarmStartConfig(
        reading_per_world=args.reading_per_world,
        subquery_questions_per_world=args.subquery_questions_per_world,
        final_per_world=args.final_per_world,
    )
    examples = list(iter_examples(args.seed, args.worlds, config, set(args.exclude)))
    write_jsonl(args.out, examples)
    counts = {task: sum(e["task"] == task for e in examples) for task in ("subanswer", "subquery", "final")}
    print(f"wrote {len(examples)} warm-start examples {counts} to {args.out}")
    return 0
