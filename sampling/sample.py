"""Rejection-sample chains for training questions (one shard of a run).

    python sampling/sample.py --config configs/sampling/toy.yaml [--key value ...]
    python sampling/sample.py --config configs/sampling/llama3.1-8b.yaml --shard 3 --num_shards 8

Every option is a field of a config dataclass of corag.commands.sample; `--help` lists them.
"""

import sys

from corag.cli import main

if __name__ == "__main__":
    sys.exit(main(["sample", *sys.argv[1:]]))
