"""`corag prepare-data SOURCE --out DIR`: the released question sets, as `hf download` wrote them, into the
questions files the configs name (`data/multihopqa/train.jsonl`, `hotpotqa_validation.jsonl`, ...).

    hf download corag/multihopqa --repo-type dataset --local-dir downloads/multihopqa
    corag prepare-data downloads/multihopqa --out data/multihopqa
    hf download corag/kilt --repo-type dataset --local-dir downloads/kilt
    corag prepare-data downloads/kilt --out data/kilt --dataset kilt
    corag prepare-data FlashRAG_datasets --dataset flashrag --wiki18 wiki-18/wiki-18.jsonl.gz --out data/flashrag

The layout it reads and where that is documented: `corag.data.release`; for the Search-R1 suite
(`--dataset flashrag`: RUC-NLPIR/FlashRAG_datasets and wiki-18), `corag.data.flashrag`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from corag.config import parse_config
from corag.data.flashrag import WIKI18, prepare_flashrag
from corag.data.release import DATASETS, prepare_release


@dataclass
class PrepareDataConfig:
    """A downloaded release and where its questions files go."""

    source: str = field(
        metadata={
            "positional": True,
            "help": "the folder `hf download corag/multihopqa (or corag/kilt) --repo-type dataset "
            "--local-dir DIR` wrote: DIR/<subset>/<split>-00000-of-00001.parquet",
        }
    )
    out: str | None = field(
        default=None,
        metadata={
            "help": "folder of the questions files: <subset>_<split>.jsonl and train.jsonl "
            "(None: data/<dataset>)"
        },
    )
    dataset: str = field(
        default="multihopqa",
        metadata={
            "choices": [*DATASETS, "flashrag"],
            "help": "which release SOURCE holds (it decides the tasks: "
            "in corag/kilt, hotpotqa is KILT's HotpotQA; flashrag: the Search-R1 suite's seven sets)",
        },
    )
    subsets: list[str] | None = field(
        default=None, metadata={"help": "only these subset folders (None: every one found)"}
    )
    wiki18: str | None = field(
        default=None,
        metadata={
            "help": "flashrag: wiki-18.jsonl(.gz) of PeterJinGo/wiki-18-corpus, laid out as OUT/wiki-18.jsonl"
        },
    )
    overwrite: bool = field(
        default=False,
        metadata={"help": "replace files in the way that this command did not write (or that changed since)"},
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_config(PrepareDataConfig, argv, "the released question sets into questions files")
    out = args.out or f"data/{args.dataset}"
    start = time.perf_counter()
    if args.dataset == "flashrag":
        done = prepare_flashrag(
            args.source, out, sets=args.subsets, wiki18=args.wiki18, overwrite=args.overwrite
        )
    else:
        done = prepare_release(
            args.source, out, dataset=args.dataset, subsets=args.subsets, overwrite=args.overwrite
        )
    for item in done:
        what = "the corpus" if item.path.name == WIKI18 else f"{item.records} questions"
        print(f"{item.path}: {what} ({'written' if item.written else 'up to date'})")
    written = sum(item.written for item in done)
    print(
        f"{len(done)} questions files in {out} ({written} written, {len(done) - written} up to date; "
        f"{time.perf_counter() - start:.1f} s)"
    )
    return 0
