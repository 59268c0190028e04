"""Files shipped inside the package, found from wherever corag is installed: the configs (package data;
`configs/` in a checkout is a link to this folder), the SFT recipe that `corag iterate` and the toy
study run as a script, and each stage's Slurm launch script (`sampling/`, `evaluation/` and `recipes/` in
a checkout link to them)."""

from pathlib import Path

from corag.errors import InputError

CONFIGS = Path(__file__).parent / "configs"
SFT_RECIPE = Path(__file__).parent / "recipes" / "sft.py"
SCRIPTS = Path(__file__).parent / "cluster" / "scripts"
# stage -> its launch script: what `corag iterate` submits, `corag plan` reads the time limit of and
# `corag submit` checks (the checkout's links have these names too).
STAGE_SCRIPTS = {
    "sample": "slurm_array.sh",
    "pool": "slurm_pool.sh",
    "train": "slurm_train.sh",
    "evaluate": "slurm_eval.sh",
    "serve": "serve_retriever.sh",
}


def stage_script(stage: str) -> Path:
    """The launch script of a stage (sft and grpo train); an unknown stage is one line naming the known."""
    name = STAGE_SCRIPTS.get("train" if stage in ("sft", "grpo") else stage)
    if name is None:
        raise InputError(
            f"no launch script for stage {stage!r}; stages: {', '.join(STAGE_SCRIPTS)}", field="stage"
        )
    return SCRIPTS / name
