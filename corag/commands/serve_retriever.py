"""`corag serve-retriever INDEX [--corpus CORPUS]`: serve an index over HTTP for many workers
(corag.retrieval.service); with its corpus, also as Search-R1's retrieval server (`POST /retrieve`)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from typing import NoReturn

from corag.config import parse_config
from corag.retrieval.service import LOOPBACK, OPTIONS_ENV, build_app


@dataclass
class ServeArgs:
    index: str = field(
        metadata={"positional": True, "help": "index folder written by `corag index` (dense or bm25)"}
    )
    host: str = field(
        default="127.0.0.1", metadata={"help": "interface to bind (default: this machine only)"}
    )
    allow_remote: bool = field(
        default=False,
        metadata={"help": "allow a --host other than loopback (the service has no authentication)"},
    )
    port: int = 8000
    device: str | None = field(default=None, metadata={"help": "query encoder device"})
    index_devices: str | None = field(
        default=None,
        metadata={"help": "GPUs of a dense index's fp16 shards: cuda:0-7, cuda:0,1 or cpu (default: every "
        "visible GPU)"},
    )  # fmt: skip
    approx: str | None = field(
        default=None, metadata={"help": "search this approximate index of a dense folder (e.g. ivf-pq)"}
    )
    max_queries: int = field(default=256, metadata={"help": "most queries in one request"})
    max_k: int = 1000
    max_body_bytes: int = 1 << 20
    max_batch: int = field(default=256, metadata={"help": "most queries coalesced into one search"})
    max_wait_ms: float = field(
        default=5.0, metadata={"help": "longest a batch waits for requests still being read (none: no wait)"}
    )
    official_k: int = field(default=5, metadata={"help": "top-k of the official API (POST /)"})
    corpus: str | None = field(
        default=None,
        metadata={
            "help": "the index's corpus: also answer Search-R1's API (POST /retrieve) with its passages"
        },
    )
    retrieve_k: int = field(
        default=3, metadata={"help": "top-k of Search-R1's API when a request names none"}
    )
    workers: int = field(default=1, metadata={"help": "processes behind the address (each loads the index)"})


# The config dataclasses of `corag serve-retriever` (what `corag plan` reads a serve config with).
CONFIGS = (ServeArgs,)


def usage_error(message: str) -> NoReturn:
    """A bad combination of options: argparse's way (the message on stderr, exit status 2)."""
    print(f"corag serve-retriever: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    args = parse_config(ServeArgs, argv, __doc__.splitlines()[0])
    if args.host not in LOOPBACK and not args.allow_remote:
        usage_error(f"--host {args.host} serves beyond this machine; add --allow-remote to mean it")
    if args.host not in LOOPBACK:
        print(
            f"warning: serving on {args.host}:{args.port} without authentication; anyone who can reach "
            "this port can query the index",
            file=sys.stderr,
        )
    if not 1 <= args.official_k <= args.max_k:
        raise SystemExit(
            f"corag serve-retriever: error: --official-k must be between 1 and --max-k ({args.max_k})"
        )
    if not 1 <= args.retrieve_k <= args.max_k:
        raise SystemExit(
            f"corag serve-retriever: error: --retrieve-k must be between 1 and --max-k ({args.max_k})"
        )
    options = {
        k: v
        for k, v in dataclasses.asdict(args).items()
        if k not in ("host", "port", "allow_remote", "workers")
    }
    from corag.plan import check_visible

    check_visible("serve", dataclasses.asdict(args))
    print(f"serving {args.index} on http://{args.host}:{args.port} ({args.workers} worker(s))")
    if args.workers > 1:
        os.environ[OPTIONS_ENV] = json.dumps(options)
        uvicorn.run(
            "corag.retrieval.service:app_from_environment",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_level="info",
        )
    else:
        uvicorn.run(build_app(options), host=args.host, port=args.port, log_level="info")
    return 0
