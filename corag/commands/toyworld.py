"""`corag toyworld`: write a toy world (corpus and questions) to a folder."""

from __future__ import annotations

from dataclasses import dataclass, field

from corag.config import parse_config
from corag.data.jsonl import check_output
from corag.errors import InputError
from corag.toy.world import generate_world


@dataclass
class ToyworldArgs:
    """The world's seed and sizes, and where to write it."""

    out: str = field(metadata={"help": "output folder"})
    seed: int = 0
    num_entities: int = 300
    num_distractors: int = 60
    train_per_hop: int = 200
    test_per_hop: int = 50
    hops: list[int] = field(default_factory=lambda: [2, 3, 4])
    test_fraction: float = 0.2


def main(argv: list[str] | None = None) -> int:
    """`corag toyworld --out DIR --seed N [sizes]`: write a toy world to a folder."""
    args = parse_config(ToyworldArgs, argv, description=main.__doc__)
    check_output(args.out, "--out", marks=("single_hop.jsonl",))
    try:
        world = generate_world(
            seed=args.seed,
            num_entities=args.num_entities,
            num_distractors=args.num_distractors,
            train_per_hop=args.train_per_hop,
            test_per_hop=args.test_per_hop,
            hops=tuple(args.hops),
            test_fraction=args.test_fraction,
        )
    except ValueError as e:  # the world's checks of its sizes, each naming the setting first
        raise InputError(str(e), field=f"--{str(e).split()[0]}") from None
    out = world.write(args.out)
    print(
        f"wrote {len(world.passages)} passages, {len(world.train)} train, {len(world.test)} test and "
        f"{len(world.single_hop)} single-hop questions to {out}"
    )
    return 0
