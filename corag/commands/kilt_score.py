"""`corag kilt-score SUBMISSION GOLD [--ks 1,5]`: validate and score a KILT submission; prints JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from corag.config import parse_config
from corag.errors import InputError
from corag.kilt import score_submission


@dataclass
class KiltScoreConfig:
    """The submission, its gold file, and how to score it."""

    submission: str = field(metadata={"positional": True, "help": "submission JSONL"})
    gold: str = field(metadata={"positional": True, "help": "gold KILT JSONL"})
    ks: str = field(default="1,5", metadata={"help": "comma-separated k for recall@k and precision@k"})
    allow_extra: bool = field(default=False, metadata={"help": "leave out ids not in the gold file"})
    require_all: bool = field(
        default=False, metadata={"help": "refuse a submission missing gold ids (default: they count 0)"}
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_config(KiltScoreConfig, argv, __doc__.splitlines()[0])
    try:
        ks = [int(k) for k in args.ks.split(",")]
    except ValueError:
        raise InputError(f"expected comma-separated integers, got {args.ks!r}", field="--ks") from None
    result = score_submission(
        args.submission, args.gold, ks=ks, allow_extra=args.allow_extra, require_all=args.require_all
    )
    print(json.dumps(result, indent=2))
    return 0
