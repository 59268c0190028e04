"""GRPO on chains: the recipe is corag.recipes.grpo (also `corag train grpo`); this script keeps
`accelerate launch recipes/grpo.py ...` and recipes/slurm_train.sh working from a checkout."""

import sys

from corag.recipes.grpo import main

if __name__ == "__main__":
    sys.exit(main())
