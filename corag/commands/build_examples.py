"""`corag build-examples`: chains become a three-task prompt/completion dataset on disk, once.

    corag build-examples --config configs/examples/llama3.1-8b.yaml [--key value ...]

The options are the fields of `corag.training.dataset.ExamplesConfig` (the SFT recipe reuses them); the
build is resumable and takes turns with other processes building the same output (see that module).
"""

from __future__ import annotations

import logging
import sys

from corag.config import parse_config
from corag.data.jsonl import check_output
from corag.lm.hub import check_model_source
from corag.training.dataset import MANIFEST, ExamplesConfig, build


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    config = parse_config(ExamplesConfig, argv, __doc__.splitlines()[0])
    check_output(config.dataset, "--dataset", marks=(MANIFEST,))
    if config.tokenizer:
        check_model_source(config.tokenizer, "--tokenizer")
    print(build(config))
    return 0
