"""The retrieval service (`corag serve-retriever`): one index served over HTTP to many workers.

POST /search {"queries": [...], "k": int} -> {"hits": [[{"doc_id", "score"}, ...], ...]}
POST /       {"query": str} -> [{"doc_id", "score"}, ...]   (the official CoRAG E5 server's API; its
             top-k is the service's `--official-k`, so the official agent can use this service)
POST /retrieve {"queries": [...], "topk": int | null, "return_scores": bool}
             -> {"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]} with return_scores,
             {"result": [[{"id", "contents"}, ...], ...]} without (Search-R1's retrieval server's API, so
             its training and evaluation can search this service; needs `--corpus`, whose passages come
             back as wiki-18 stores them: `contents` is the title line, a newline and the text)
GET /health -> {"status": "ok", "searches": ..., "queries": ..., "index": fingerprint}

Requests that arrive together, on either API, are coalesced: a batching loop takes everything queued
within a short wait (at most `max_wait_ms`, or until `max_batch` queries) and runs one batched search
in a worker thread, so the encoder and the index see large batches while each client sends one query
at a time. `--workers N` runs N processes behind one address (each loads the index: for BM25 or a
CPU index, not for one that fills a GPU). The service binds to this machine only unless
`--allow-remote` is given (it has no authentication).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, ValidationError

from corag.retrieval.base import Retriever
from corag.types import Hit, Passage

if TYPE_CHECKING:
    from corag.data.corpus import Corpus

M = TypeVar("M", bound=BaseModel)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    queries: list[StrictStr]
    k: StrictInt = 10


class OfficialRequest(BaseModel):
    """The official E5 server's request: one query, top-k fixed by the server."""

    query: StrictStr


class RetrieveRequest(BaseModel):
    """Search-R1's request (search_r1/search/retrieval_server.py, `QueryRequest`): its fields and
    defaults; a missing or null `topk` is the server's own (`--retrieve-k`, 3 as released)."""

    model_config = ConfigDict(extra="forbid")
    queries: list[StrictStr]
    topk: StrictInt | None = None
    return_scores: StrictBool = False


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future = field(repr=False)


class Batcher:
    """Collects concurrent requests and runs them as one `retriever.search` call in a worker thread.

    A batch waits for company only while other requests are on their way in (their bodies being read
    inside `arriving()`), and never longer than `max_wait_s`: a lone client pays no wait at all."""

    def __init__(self, retriever: Retriever, max_batch: int = 256, max_wait_s: float = 0.005) -> None:
        self.retriever, self.max_batch, self.max_wait_s = retriever, max_batch, max_wait_s
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.searches = 0
        self.queries = 0
        self.incoming = 0  # requests being read and checked, about to be queued

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """Marks a request on its way to `search` (the batch being collected may wait for it)."""
        self.incoming += 1
        try:
            yield
        finally:
            self.incoming -= 1

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        future = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(_Pending(queries, k, future))
        return await future

    async def _collect(self) -> list[_Pending]:
        batch = [await self.queue.get()]
        size = len(batch[0].queries)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while size < self.max_batch:
            if self.queue.empty() and not self.incoming:
                await asyncio.sleep(0)  # let requests that just came in start
                if self.queue.empty() and not self.incoming:
                    break
            timeout = deadline - loop.time()
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


def _hits_json(row: list[Hit]) -> list[dict]:
    return [{"doc_id": h.doc_id, "score": h.score} for h in row]


def _over_limits(queries: int, k: int, field: str, max_queries: int, max_k: int) -> JSONResponse | None:
    """The error a request of `queries` queries at top-`k` (named `field`) gets, or None."""
    if queries > max_queries:
        return _error(413, f"{queries} queries in one request; at most {max_queries}")
    if not 1 <= k <= max_k:
        return JSONResponse(
            {"detail": [{"loc": [field], "msg": f"{field} must be between 1 and {max_k}"}]}, status_code=422
        )
    return None


def document_json(p: Passage) -> dict:
    """A passage as Search-R1's server returns it: the corpus line of wiki-18, `{"id", "contents"}` with
    the title as the first line of `contents` (the layout the release's `_passages2string` reads)."""
    return {"id": p.id, "contents": f"{p.title}\n{p.contents}" if p.title else p.contents}


def _invalid(e: ValidationError) -> JSONResponse:
    errors = [{"loc": list(err["loc"]), "msg": err["msg"]} for err in e.errors(include_url=False)]
    return JSONResponse({"detail": errors}, status_code=422)


async def _parse(request: Request, model: type[M], max_body_bytes: int) -> M | JSONResponse:
    """The request body read (within the limit) and validated as `model`, or the error to answer."""
    body = await _read_body(request, max_body_bytes)
    if body is None:
        return _error(413, f"request body over {max_body_bytes} bytes")
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        return _invalid(e)


async def _read_body(request: Request, max_body_bytes: int) -> bytes | None:
    """The request body, or None when it is over the limit (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > max_body_bytes):
        return None
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > max_body_bytes:
            return None
    return bytes(body)


def create_app(
    retriever: Retriever,
    max_queries: int = 256,
    max_k: int = 1000,
    max_body_bytes: int = 1 << 20,
    max_batch: int = 256,
    max_wait_ms: float = 5.0,
    official_k: int = 5,
    fingerprint: str = "",
    corpus: Corpus | None = None,
    retrieve_k: int = 3,
) -> FastAPI:
    """The HTTP app around `retriever`, with request limits (413 too large, 422 malformed).

    `official_k` is the top-k of the official API (`POST /`); `fingerprint` names the index in
    /health, so clients can tell which index answers wherever the service runs. `corpus` (the index's
    own) gives Search-R1's API (`POST /retrieve`) its documents; `retrieve_k` is that API's default
    top-k."""
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
        return {
            "status": "ok",
            "searches": batcher.searches,
            "queries": batcher.queries,
            "index": fingerprint,
            "official_k": official_k,
            "retrieve_k": retrieve_k if corpus is not None else None,
        }

    @app.post("/")
    async def official(request: Request) -> JSONResponse:
        with batcher.arriving():
            req = await _parse(request, OfficialRequest, max_body_bytes)
        if isinstance(req, JSONResponse):
            return req
        (row,) = await batcher.search([req.query], official_k)
        return JSONResponse(_hits_json(row))

    @app.post("/search")
    async def search(request: Request) -> JSONResponse:
        with batcher.arriving():
            req = await _parse(request, SearchRequest, max_body_bytes)
        if isinstance(req, JSONResponse):
            return req
        if refused := _over_limits(len(req.queries), req.k, "k", max_queries, max_k):
            return refused
        if not req.queries:
            return JSONResponse({"hits": []})
        hits = await batcher.search(req.queries, req.k)
        return JSONResponse({"hits": [_hits_json(row) for row in hits]})

    @app.post("/retrieve")
    async def retrieve(request: Request) -> JSONResponse:
        with batcher.arriving():
            req = await _parse(request, RetrieveRequest, max_body_bytes)
        if isinstance(req, JSONResponse):
            return req
        if corpus is None:
            return _error(404, "this service has no corpus to return documents from (start it with --corpus)")
        k = retrieve_k if req.topk is None else req.topk  # topk 0, the release's default, is refused
        if refused := _over_limits(len(req.queries), k, "topk", max_queries, max_k):
            return refused
        hits = await batcher.search(req.queries, k) if req.queries else []
        documents = await asyncio.to_thread(
            lambda: [[document_json(p) for p in corpus.get_many([h.doc_id for h in row])] for row in hits]
        )
        if not req.return_scores:
            return JSONResponse({"result": documents})
        scored = [
            [{"document": d, "score": h.score} for d, h in zip(docs, row, strict=True)]
            for docs, row in zip(documents, hits, strict=True)
        ]
        return JSONResponse({"result": scored})

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


LOOPBACK = ("127.0.0.1", "localhost", "::1")
OPTIONS_ENV = "CORAG_SERVE_RETRIEVER_OPTIONS"  # how `--workers` hands the options to each process


def build_app(options: dict) -> FastAPI:
    """Load the index named in `options` (the command's arguments), and its corpus when one is named
    (checked to be the index's own before the index loads), and wrap them in the app."""
    from corag.retrieval import check_corpus, index_fingerprint, load_retriever

    corpus = None
    if options.get("corpus"):
        from corag.data.corpus import Corpus

        corpus = Corpus.load(options["corpus"])
        check_corpus(options["index"], corpus)
    extra = {"approx": options["approx"]} if options.get("approx") else {}
    retriever = load_retriever(
        options["index"], device=options.get("device"), index_devices=options.get("index_devices"), **extra
    )
    return create_app(
        retriever,
        options["max_queries"],
        options["max_k"],
        options["max_body_bytes"],
        options["max_batch"],
        options["max_wait_ms"],
        official_k=options["official_k"],
        fingerprint=index_fingerprint(options["index"]),
        corpus=corpus,
        retrieve_k=options.get("retrieve_k", 3),
    )


def app_from_environment() -> FastAPI:
    """The app of one `--workers` process (uvicorn's factory), from the options the command set."""
    return build_app(json.loads(os.environ[OPTIONS_ENV]))
