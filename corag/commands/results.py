"""`corag results ROOT`: one table over several evaluations (`ROOT/<dataset>/<run>/metrics.json`).

evaluation/slurm_eval.sh runs it at the end; it writes ROOT/results.md and ROOT/results.csv and prints
the table.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from corag.config import parse_config
from corag.errors import InputError
from corag.evaluation import merged_results


@dataclass
class ResultsArgs:
    root: str = field(metadata={"positional": True, "help": "folder of evaluation folders, one per dataset"})


def main(argv: list[str] | None = None) -> int:
    args = parse_config(ResultsArgs, sys.argv[1:] if argv is None else argv, __doc__.splitlines()[0])
    root = Path(args.root)
    if not root.is_dir():
        raise InputError("no such folder", file=args.root)
    print(merged_results(root).read_text())
    return 0
