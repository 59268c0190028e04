"""`corag train sft|grpo ...`: a training recipe (corag.recipes) with its flags; under several processes,
`accelerate launch -m corag.recipes.sft ...` runs the same recipe."""

from __future__ import annotations

import difflib
import importlib
import sys

# recipe name -> module whose main(argv) runs it
RECIPES: dict[str, str] = {"sft": "corag.recipes.sft", "grpo": "corag.recipes.grpo"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(
            f"usage: corag train {{{','.join(RECIPES)}}} [--config FILE] [--key value ...]\n\n"
            "`corag train RECIPE --help` lists a recipe's settings",
            file=sys.stdout if argv else sys.stderr,
        )
        raise SystemExit(0 if argv else 2)
    if argv[0] not in RECIPES:
        close = difflib.get_close_matches(argv[0], RECIPES, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; choose one of {', '.join(RECIPES)}"
        print(f"corag train: error: unknown recipe {argv[0]!r}{hint}", file=sys.stderr)
        raise SystemExit(2)
    sys.argv[0] = f"corag train {argv[0]}"  # argparse's usage line names the recipe
    return int(importlib.import_module(RECIPES[argv[0]]).main(argv[1:]) or 0)
