"""Files shipped inside the package, found from wherever corag is installed: the configs (package data;
`configs/` in a checkout is a link to this folder) and the SFT recipe that `corag iterate` and the toy
study run as a script."""

from pathlib import Path

CONFIGS = Path(__file__).parent / "configs"
SFT_RECIPE = Path(__file__).parent / "recipes" / "sft.py"
