"""`corag kilt-pages KNOWLEDGE_SOURCE --out pages.json`: the title -> Wikipedia page id map that turns
retrieved passages into KILT provenance (`corag evaluate --page-ids pages.json`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from corag.config import parse_config
from corag.data.jsonl import check_output
from corag.kilt import build_page_ids


@dataclass
class KiltPagesConfig:
    """KILT's knowledge source and where its page map goes."""

    knowledge_source: str = field(
        metadata={"positional": True, "help": "kilt_knowledgesource.json (one page a line)"}
    )
    out: str = field(metadata={"help": "the JSON map to write"})


def main(argv: list[str] | None = None) -> int:
    args = parse_config(KiltPagesConfig, argv, __doc__)
    check_output(args.out, "--out")
    counts = build_page_ids(args.knowledge_source, args.out)
    print(json.dumps(counts))
    print(f"title -> page id map of {counts['pages']} pages written to {args.out}")
    return 0
