"""`corag toystudy`: the full toy-world study (see benchmarks/toyworld.py), or any size of it."""

from __future__ import annotations

import json
from pathlib import Path

from corag.config import parse_config
from corag.toy.study import StudyConfig, run_study

DESCRIPTION = "The toy-world study: the whole CoRAG loop, for real, on a CPU."


def main(argv: list[str] | None = None, description: str = DESCRIPTION) -> int:
    """Run (or resume) the study that `argv` configures; `description` heads its --help."""
    cfg = parse_config(StudyConfig, argv, description=description)
    summary = run_study(cfg)
    print(json.dumps(summary["timings_s"]))
    if cfg.warm_only:
        print(f"warm model at {cfg.warm_dir or Path(cfg.out_dir) / 'models' / 'warm'}")
    else:
        print(f"study written to {cfg.out_dir} (summary.json, eval/results.md, eval/scaling.png)")
    return 0
