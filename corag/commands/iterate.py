"""`corag iterate`: iterated rejection sampling, R rounds of sample, train and evaluate (corag/iterate.py)."""

from __future__ import annotations

import sys

from corag.cluster.rounds import JobFailed
from corag.config import parse_config
from corag.iterate import IterateConfig, iterate
from corag.resources import CONFIGS
from corag.sampling import SamplingConfig

TOY = CONFIGS / "iterate/toy.yaml"


def main(argv: list[str] | None = None) -> int:
    """`corag iterate [--config FILE] [--key value ...]`: each round's fine-tuned model samples the next
    round's chains; a rerun of the same --out_dir resumes at the first unfinished stage. Without --config,
    the package's configs/iterate/toy.yaml: two rounds from `corag quickstart`'s model, in its folder.
    With `launcher: slurm` each stage is a Slurm job (configs/iterate/llama3.1-8b.yaml); a job that fails
    ends the run in one line (exit status 1), and the same command resumes it."""
    argv = list(argv or [])
    if not any(a == "--config" or a.startswith("--config=") for a in argv):
        argv = ["--config", str(TOY), *argv]
    cfg, sampling = parse_config((IterateConfig, SamplingConfig), argv, description=main.__doc__)
    try:
        rows = iterate(cfg, sampling)
    except JobFailed as error:
        print(f"corag iterate: {error}", file=sys.stderr)
        return 1
    print(f"{len(rows)} round(s) in {cfg.out_dir}: rounds.md, rounds.json")
    return 0
