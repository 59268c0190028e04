"""`corag kilt-pages KNOWLEDGE_SOURCE --out pages.json`: the title -> Wikipedia page id map that turns
retrieved passages into KILT provenance (`corag evaluate --page-ids pages.json`).

KNOWLEDGE_SOURCE is KILT's `kilt_knowledgesource.json` as published (one JSON page a line with
`wikipedia_id` and `wikipedia_title`; 34.76 GiB), fetched once:

    wget -P downloads http://dl.fbaipublicfiles.com/KILT/kilt_knowledgesource.json
    corag kilt-pages downloads/kilt_knowledgesource.json --out data/kilt-pages.json

A missing file, or one whose first record is no such page, is refused in one line before anything is read
further.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from corag.config import parse_config
from corag.data.jsonl import check_output
from corag.kilt import KNOWLEDGE_SOURCE_URL, build_page_ids


@dataclass
class KiltPagesConfig:
    """KILT's knowledge source and where its page map goes."""

    knowledge_source: str = field(
        metadata={
            "positional": True,
            "help": f"KILT's kilt_knowledgesource.json (one page a line; {KNOWLEDGE_SOURCE_URL})",
        }
    )
    out: str = field(metadata={"help": "the JSON map to write"})


def main(argv: list[str] | None = None) -> int:
    args = parse_config(KiltPagesConfig, argv, "the title -> page id map of KILT's knowledge source")
    check_output(args.out, "--out")
    counts = build_page_ids(args.knowledge_source, args.out)
    print(json.dumps(counts))
    print(f"title -> page id map of {counts['pages']} pages written to {args.out}")
    return 0
