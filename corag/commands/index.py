"""`corag index`: dense indexes (encoded, sharded over processes, or imported) and BM25 indexes.

    corag index CORPUS --out DIR [--kind bm25] [--model minilm] [--shard i --num-shards n | --merge]
    corag index CORPUS --out DIR --from-embeddings DIR        # the released CoRAG embeddings
    corag index CORPUS --out DIR --from-faiss e5_Flat.index --model e5-base-v2   # Search-R1's index
    corag index CORPUS --out DIR --approx ivf-pq              # also an approximate faiss index
    corag index CORPUS --out DIR --skip-empty                 # leave out passages without any text

Empty passages (no title, no contents) are indexed as they are, after one warning line with their count
and first ids: the index's rows stay the corpus's rows (as released embeddings and every shard of a
sharded build count them), and a corpus with holes is the user's to mend or accept, not ours to change
without a word. They are not harmless: BM25 never finds them, but a dense encoder gives them a vector
(of the passage prefix alone) that some queries rank high. `--skip-empty` leaves them out (the index
then names its rows in ids.json) and says how many; a corpus of empty passages only is refused.

How the folders are laid out, resumed and merged: corag/retrieval/index.py.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from corag.config import parse_config
from corag.data.corpus import Corpus
from corag.data.jsonl import check_output
from corag.errors import InputError
from corag.lm.hub import check_model_source
from corag.retrieval.dense import Encoder, model_key, resolve_model
from corag.retrieval.index import (
    APPROX_KINDS,
    CHUNK_DIR,
    DEFAULT_CHUNK_SIZE,
    FAISS_QUERY_MAX_LENGTH,
    EncoderSettings,
    build_approx,
    build_bm25,
    build_dense,
    import_embeddings,
    import_faiss,
    is_complete,
    merge_dense,
)


@dataclass
class IndexConfig:
    """What `corag index` builds, from which corpus, and where."""

    corpus: str = field(
        metadata={"positional": True, "help": "corpus source (see `corag corpus prepare`) or prepared store"}
    )
    out: str = field(metadata={"help": "index folder (created; resumed if it holds a partial build)"})
    kind: str = field(default="dense", metadata={"choices": ["dense", "bm25"]})
    model: str = field(
        default="e5-large-v2", metadata={"help": "preset (e5-large-v2, e5-base-v2, minilm) or path"}
    )
    query_prefix: str | None = field(default=None, metadata={"help": "overrides the preset's query prefix"})
    passage_prefix: str | None = field(
        default=None, metadata={"help": "overrides the preset's passage prefix"}
    )
    query_max_length: int | None = field(
        default=None, metadata={"help": "query tokens kept (E5: 64; with --from-faiss: 256, as released)"}
    )
    chunk_size: int = field(default=DEFAULT_CHUNK_SIZE, metadata={"help": "passages per saved chunk"})
    batch_size: int = field(default=64, metadata={"help": "encoder batch size"})
    dtype: str = field(
        default="float16", metadata={"choices": ["float16", "float32"], "help": "stored vector type"}
    )
    device: str | None = field(
        default=None, metadata={"help": "encoder device (default: GPU if present, in fp16)"}
    )
    shard: int = field(default=0, metadata={"help": "which contiguous part of the chunks to encode"})
    num_shards: int = field(default=1, metadata={"help": "parts the encoding is split into"})
    merge: bool = field(default=False, metadata={"help": "complete a sharded build (checks every chunk)"})
    from_embeddings: str | None = field(
        default=None, metadata={"help": "import NAME-shard-N.pt files instead of encoding"}
    )
    from_faiss: str | None = field(
        default=None,
        metadata={
            "help": "import a flat faiss index (e5_Flat.index) instead of encoding; --model names its encoder"
        },
    )
    approx: str | None = field(
        default=None,
        metadata={
            "choices": list(APPROX_KINDS),
            "help": "also build this approximate index (a finished folder is used as it is)",
        },
    )
    factory: str | None = field(
        default=None, metadata={"help": "faiss index_factory string (overrides --approx's)"}
    )
    nlist: int | None = field(default=None, metadata={"help": "IVF lists (default about 4 x sqrt(rows))"})
    pq_m: int = field(default=64, metadata={"help": "IVF-PQ bytes per vector"})
    hnsw_m: int = field(default=32, metadata={"help": "HNSW neighbours per node"})
    nprobe: int = field(default=32, metadata={"help": "IVF lists searched per query"})
    ef_search: int = field(default=128, metadata={"help": "HNSW search depth"})
    rerank: int = field(default=100, metadata={"help": "candidates re-scored exactly (0: none)"})
    train_size: int = field(default=200_000, metadata={"help": "vectors used to train IVF / PQ"})
    overwrite: bool = field(
        default=False,
        metadata={"help": "build afresh; the old index is kept aside until the new one is complete"},
    )
    skip_empty: bool = field(
        default=False,
        metadata={"help": "leave passages without title and contents out of the index (counted)"},
    )


def check_passages(corpus: Corpus, source: str, skip_empty: bool) -> None:
    """A corpus of empty passages only is refused (nothing to search); empty ones among others are
    counted, with their first ids, in one line: a warning that they are indexed as they are, or, with
    `skip_empty`, what was left out."""
    empty = corpus.empty_rows()
    if len(empty) == len(corpus):
        raise InputError(
            f"all {len(empty)} passages are empty (no title, no contents): nothing to search", file=source
        )
    if len(empty):
        ids = ", ".join(repr(corpus.ids[int(r)]) for r in empty[:5]) + (", ..." if len(empty) > 5 else "")
        what = f"{len(empty)} of {len(corpus)} passages are empty (no title, no contents; ids {ids})"
        if skip_empty:
            print(f"{source}: {what}: left out of the index")
        else:
            print(
                f"warning: {source}: {what}: indexed as they are (a dense search can return them); "
                "--skip-empty leaves them out",
                file=sys.stderr,
            )


def faiss_encoder(args: IndexConfig) -> EncoderSettings:
    """The encoder a released faiss index was built with, as the index records it (the model is not
    loaded here); queries are cut at 256 tokens unless told otherwise, as the release's server cuts them."""
    model, qp, pp, _ = resolve_model(args.model)
    return EncoderSettings(
        model_key(model),
        qp if args.query_prefix is None else args.query_prefix,
        pp if args.passage_prefix is None else args.passage_prefix,
        FAISS_QUERY_MAX_LENGTH if args.query_max_length is None else args.query_max_length,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_config(IndexConfig, argv, __doc__.splitlines()[0])
    check_output(args.out, "--out", marks=("manifest.json", CHUNK_DIR))  # --overwrite included
    for name in ("chunk_size", "batch_size", "num_shards"):
        if getattr(args, name) < 1:
            raise InputError(f"must be 1 or more, got {getattr(args, name)}", field=f"--{name}")
    if args.skip_empty and args.from_embeddings:
        raise InputError(
            "imported embeddings hold a vector for every corpus row: --skip-empty applies to builds that "
            "encode",
            field="--skip-empty",
        )
    corpus = Corpus.load(args.corpus)
    check_passages(corpus, args.corpus, args.skip_empty)
    if args.kind == "bm25":
        out = build_bm25(corpus, args.out, overwrite=args.overwrite, skip_empty=args.skip_empty)
        print(f"bm25 index of {len(corpus)} passages written to {out}")
        return 0
    out = Path(args.out)
    finished = is_complete(out, {"kind": "dense", "corpus_size": len(corpus)})
    if args.approx and finished and not (args.from_embeddings or args.merge or args.overwrite):
        print(f"adding an approximate index to the finished index in {out}")
    elif args.from_faiss:
        out = import_faiss(
            corpus, out, args.from_faiss, faiss_encoder(args), args.dtype, args.overwrite, args.chunk_size
        )
        print(f"dense index of {len(corpus)} passages imported from {args.from_faiss} into {out}")
    else:
        model, qp, pp, qmax = resolve_model(args.model)
        check_model_source(model, "--model")
        encoder = Encoder(
            model,
            qp if args.query_prefix is None else args.query_prefix,
            pp if args.passage_prefix is None else args.passage_prefix,
            qmax if args.query_max_length is None else args.query_max_length,
            device=args.device,
            batch_size=args.batch_size,
        )
        if args.from_embeddings:
            out = import_embeddings(corpus, out, args.from_embeddings, encoder, args.dtype, args.overwrite)
        elif args.merge:
            out = merge_dense(corpus, out, args.skip_empty)
        else:
            started = time.perf_counter()
            out = build_dense(
                corpus,
                out,
                encoder,
                args.chunk_size,
                args.dtype,
                args.overwrite,
                args.shard,
                args.num_shards,
                args.skip_empty,
            )
            print(f"encoding took {time.perf_counter() - started:.1f} s (encoder loaded before)")
            if args.num_shards > 1:
                return 0
        print(f"dense index of {len(corpus)} passages written to {out}")
    if args.approx:
        report = build_approx(
            out,
            args.approx,
            factory=args.factory,
            nlist=args.nlist,
            pq_m=args.pq_m,
            hnsw_m=args.hnsw_m,
            nprobe=args.nprobe,
            ef_search=args.ef_search,
            rerank=args.rerank,
            train_size=args.train_size,
        )
        print(json.dumps(report))
    return 0
