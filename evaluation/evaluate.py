"""Evaluate a checkpoint (or a prediction file) on a dataset; the same as `corag evaluate`.

    python evaluation/evaluate.py --model runs/corag --data hotpot_dev_distractor_v1.json \
        --corpus corpus.jsonl --retriever data/index/e5-large-v2 --out-dir runs/eval/hotpotqa \
        --methods greedy:L=1,2,3,6 best_of_n:L=6:N=4,8 tree_search:L=6 ircot searchain

Every option: `--help`. For KILT tasks a submission file is written per run (`--page-ids` for its
provenance); `--rules corag` scores as the paper does, `--official-files` writes the official files.
"""

import sys

from corag.cli import main

if __name__ == "__main__":
    sys.exit(main(["evaluate", *sys.argv[1:]]))
