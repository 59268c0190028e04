"""The quickstart's shipped files: the whole loop on the toy world, on a CPU, in a few minutes.

`corag quickstart` runs the toy-world study (corag/toy/study.py) at the size in `CONFIG`
(corag/toy/quickstart.yaml), starting from the warm model shipped in `WARM` (corag/toy/warm-model,
made by the study's own warm start; its settings and held-out accuracies are in its warm_start.json):
build a world the warm model never saw, index it with MiniLM, rejection-sample chains, fine-tune,
evaluate greedy, best-of-N and tree search beside single-step retrieval and no retrieval, and print the
table. Both are package data, so an installed corag finds them wherever it runs.
"""

from __future__ import annotations

from pathlib import Path

CONFIG = Path(__file__).resolve().parent / "quickstart.yaml"
WARM = Path(__file__).resolve().parent / "warm-model"
