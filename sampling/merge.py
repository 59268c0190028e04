"""Join the shard files of a sampling run, checking that every question appears exactly once.

python sampling/merge.py --questions train.jsonl --out chains.jsonl runs/chains/chains-*.jsonl
"""

import sys

from corag.sampling import merge_main

if __name__ == "__main__":
    sys.exit(merge_main())
