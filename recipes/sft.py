"""Three-task SFT: the recipe is corag.recipes.sft (also `corag train sft`); this script keeps
`accelerate launch recipes/sft.py ...` and recipes/slurm_train.sh working from a checkout."""

import sys

from corag.recipes.sft import main

if __name__ == "__main__":
    sys.exit(main())
