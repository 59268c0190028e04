"""The training recipes, each one file read top to bottom: `sft` (three-task SFT) and `grpo` (GRPO on
chains). Run as `corag train sft|grpo ...`, `accelerate launch -m corag.recipes.sft ...`, or through the
thin scripts recipes/sft.py and recipes/grpo.py in a checkout."""
