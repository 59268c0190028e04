"""Redraw the table and scaling plot of an evaluation folder from its runs' metrics.json files.

python evaluation/plot.py runs/eval/hotpotqa [--metric f1]
"""

import argparse
from pathlib import Path

from corag.evaluation import folder_results, write_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--metric", default="em")
    args = parser.parse_args()
    results = folder_results(args.folder)
    if not results:
        raise SystemExit(f"no */metrics.json under {args.folder}")
    paths = write_results(results, args.folder, metric=args.metric)
    print(paths["table"].read_text())
    print(f"table {paths['table']}, plot {paths['plot']}")


if __name__ == "__main__":
    main()
