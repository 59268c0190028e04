"""Join the shard files of a sampling run, checking that every question appears exactly once.

python sampling/merge.py --questions train.jsonl --out chains.jsonl runs/chains/chains-*.jsonl
"""

import sys

from corag.cli import main

if __name__ == "__main__":
    sys.exit(main(["merge", *sys.argv[1:]]))
