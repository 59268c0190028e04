"""`corag quickstart`: the whole loop on the toy world, on a CPU, in a few minutes.

It runs the toy-world study (corag/toystudy.py) at the size in configs/toy/quickstart.yaml: build a
world, warm-start a tiny model, index the world with MiniLM, rejection-sample chains, fine-tune,
evaluate greedy, best-of-N and tree search beside single-step retrieval and no retrieval, and print
the table. Any study setting can be overridden: `corag quickstart --out_dir runs/qs2 --seed 1`.
"""

from __future__ import annotations

from pathlib import Path

from corag import toystudy

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "toy" / "quickstart.yaml"


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if "--config" not in argv:
        argv = ["--config", str(CONFIG), *argv]
    return toystudy.main(argv)
