"""`corag iterate`: iterated rejection sampling, R rounds of sample, train and evaluate (corag/iterate.py)."""

from __future__ import annotations

from corag.config import parse_config
from corag.iterate import IterateConfig, iterate
from corag.sampling import SamplingConfig


def main(argv: list[str] | None = None) -> int:
    """`corag iterate --config configs/iterate/toy.yaml [--key value ...]`: each round's fine-tuned model
    samples the next round's chains; a rerun of the same --out_dir resumes at the first unfinished stage."""
    cfg, sampling = parse_config((IterateConfig, SamplingConfig), argv, description=main.__doc__)
    rows = iterate(cfg, sampling)
    print(f"{len(rows)} round(s) in {cfg.out_dir}: rounds.md, rounds.json")
    return 0
