"""`corag serve-retriever`: one index served over HTTP to many sampling or evaluation workers.

POST /search {"queries": [...], "k": int} -> {"hits": [[{"doc_id", "score"}, ...], ...]}
GET /health -> {"status": "ok", "searches": ..., "queries": ...}

Requests that arrive together are coalesced: a batching loop takes everything queued within a short
wait (or up to `max_batch` queries) and runs one batched search in a worker thread, so the encoder and
the index see large batches while each client sends one query at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

from corag.retrieval.base import Retriever
from corag.types import Hit


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    queries: list[StrictStr]
    k: StrictInt = 10


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future = field(repr=False)


class Batcher:
    """Collects concurrent requests and runs them as one `retriever.search` call in a worker thread."""

    def __init__(self, retriever: Retriever, max_batch: int = 256, max_wait_s: float = 0.002) -> None:
        self.retriever, self.max_batch, self.max_wait_s = retriever, max_batch, max_wait_s
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.searches = 0
        self.queries = 0

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(_Pending(queries, k, future))
        return await future

    async def _collect(self) -> list[_Pending]:
        batch = [await self.queue.get()]
        size = len(batch[0].queries)
        deadline = asyncio.get_running_loop().time() + self.max_wait_s
        while size < self.max_batch:
            timeout = deadline - asyncio.get_running_loop().time()
            try:
                item = (
                    self.queue.get_nowait()
                    if timeout <= 0
                    else await asyncio.wait_for(self.queue.get(), timeout)
                )
            except (asyncio.QueueEmpty, asyncio.TimeoutError):
                break
            batch.append(item)
            size += len(item.queries)
        return batch

    async def run(self) -> None:
        while True:
            batch = await self._collect()
            queries = [q for p in batch for q in p.queries]
            k = max(p.k for p in batch)
            try:
                hits = await asyncio.to_thread(self.retriever.search, queries, k)
            except Exception as e:  # handed to every waiting request, which answers 500
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(e)
                continue
            self.searches += 1
            self.queries += len(queries)
            start = 0
            for p in batch:
                if not p.future.done():  # a client that disconnected leaves a cancelled future
                    p.future.set_result([h[: p.k] for h in hits[start : start + len(p.queries)]])
                start += len(p.queries)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


def create_app(
    retriever: Retriever,
    max_queries: int = 256,
    max_k: int = 1000,
    max_body_bytes: int = 1 << 20,
    max_batch: int = 256,
    max_wait_ms: float = 2.0,
) -> FastAPI:
    """The HTTP app around `retriever`, with request limits (413 too large, 422 malformed)."""
    batcher = Batcher(retriever, max_batch, max_wait_ms / 1000)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        task = asyncio.create_task(batcher.run())
        yield
        task.cancel()

    app = FastAPI(title="corag retriever", lifespan=lifespan)
    app.state.batcher = batcher

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "searches": batcher.searches, "queries": batcher.queries}

    @app.post("/search")
    async def search(request: Request) -> JSONResponse:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_body_bytes):
            return _error(413, f"request body over {max_body_bytes} bytes")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > max_body_bytes:
                return _error(413, f"request body over {max_body_bytes} bytes")
        try:
            req = SearchRequest.model_validate_json(bytes(body))
        except ValidationError as e:
            errors = [{"loc": list(err["loc"]), "msg": err["msg"]} for err in e.errors(include_url=False)]
            return JSONResponse({"detail": errors}, status_code=422)
        if len(req.queries) > max_queries:
            return _error(413, f"{len(req.queries)} queries in one request; at most {max_queries}")
        if not 1 <= req.k <= max_k:
            return JSONResponse(
                {"detail": [{"loc": ["k"], "msg": f"k must be between 1 and {max_k}"}]}, status_code=422
            )
        if not req.queries:
            return JSONResponse({"hits": []})
        hits = await batcher.search(req.queries, req.k)
        return JSONResponse({"hits": [[{"doc_id": h.doc_id, "score": h.score} for h in row] for row in hits]})

    return app


class BackgroundServer:
    """Serve an app with uvicorn in a daemon thread (tests, benchmarks, notebooks); port 0 picks a free one."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = ""

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("retrieval service did not start")
            time.sleep(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="corag serve-retriever", description=__doc__.splitlines()[0])
    ap.add_argument("index", help="index folder written by `corag index` (dense or bm25)")
    ap.add_argument("--host", default="127.0.0.1", help="interface to bind (default: this machine only)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--device", default=None, help="query encoder device")
    ap.add_argument(
        "--approx", default=None, help="search this approximate index of a dense folder (e.g. ivf-pq)"
    )
    ap.add_argument("--max-queries", type=int, default=256, help="most queries in one request")
    ap.add_argument("--max-k", type=int, default=1000)
    ap.add_argument("--max-body-bytes", type=int, default=1 << 20)
    ap.add_argument("--max-batch", type=int, default=256, help="most queries coalesced into one search")
    ap.add_argument("--max-wait-ms", type=float, default=2.0, help="how long a batch waits for company")
    args = ap.parse_args(argv)

    from corag.retrieval import load_retriever

    retriever = load_retriever(
        args.index, device=args.device, **({"approx": args.approx} if args.approx else {})
    )
    app = create_app(
        retriever, args.max_queries, args.max_k, args.max_body_bytes, args.max_batch, args.max_wait_ms
    )
    print(f"serving {args.index} on http://{args.host}:{args.port}")
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
