"""`corag quickstart`: the whole loop on the toy world, on a CPU, in a few minutes.

It runs the toy-world study (corag/toystudy.py) at the size in configs/toy/quickstart.yaml, starting
from the warm model shipped in models/toy-warm (made by the study's own warm start; its settings and
held-out accuracies are in its warm_start.json): build a world the warm model never saw, index it with
MiniLM, rejection-sample chains, fine-tune, evaluate greedy, best-of-N and tree search beside
single-step retrieval and no retrieval, and print the table. `--from-scratch` warm-starts a model
from nothing instead, for minutes only (into runs/quickstart-scratch): the pipeline runs, but that
model answers nothing. Any study setting can be overridden: `corag quickstart --out_dir runs/qs2`.
"""

from __future__ import annotations

from pathlib import Path

from corag import toystudy

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "toy" / "quickstart.yaml"
WARM = REPO / "models" / "toy-warm"
DESCRIPTION = (
    "The whole CoRAG loop on one toy world from the shipped warm model (models/toy-warm); "
    "--from-scratch warm-starts a model from nothing instead (into runs/quickstart-scratch)."
)


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if "--from-scratch" in argv:
        argv.remove("--from-scratch")
        argv = ["--out_dir", "runs/quickstart-scratch", *argv]
    elif "--warm_dir" not in argv:
        argv = ["--warm_dir", str(WARM), *argv]
    if "--config" not in argv:
        argv = ["--config", str(CONFIG), *argv]
    return toystudy.main(argv, description=DESCRIPTION)
