"""`corag quickstart`: the whole loop on the toy world, on a CPU, in a few minutes (corag/toy/).

`--from-scratch` warm-starts a model from nothing instead of starting from the shipped one, for minutes
only (into runs/quickstart-scratch): the pipeline runs, but that model answers nothing. Any study
setting can be overridden: `corag quickstart --out_dir runs/qs2`.
"""

from __future__ import annotations

from corag.commands import toystudy
from corag.toy.quickstart import CONFIG, WARM

DESCRIPTION = (
    "The whole CoRAG loop on one toy world from the shipped warm model (corag/toy/warm-model); "
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
