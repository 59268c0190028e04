"""The retrieval service: same hits as direct search, request limits, coalescing, client retries, CLI."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from pydantic import BaseModel

from corag.errors import InputError
from corag.retrieval import load_retriever
from corag.retrieval.bm25 import BM25Retriever, build_bm25_folder
from corag.retrieval.client import RetrieverClient
from corag.retrieval.service import BackgroundServer, create_app
from corag.types import Hit


class CountingRetriever:
    """Wraps a real retriever, counting batched calls; `delay` makes each call hold the worker a while."""

    def __init__(self, inner, delay: float = 0.0) -> None:
        self.inner, self.delay, self.calls, self.sizes = inner, delay, 0, []

    def search(self, queries, k):
        self.calls += 1
        self.sizes.append(len(queries))
        time.sleep(self.delay)
        return self.inner.search(queries, k)


class FailingRetriever:
    def search(self, queries, k):
        raise RuntimeError("index went away")


@pytest.fixture(scope="module")
def bm25(toy_world) -> BM25Retriever:
    return BM25Retriever.from_passages(toy_world.passages)


@pytest.fixture(scope="module")
def server(bm25):
    counting = CountingRetriever(bm25)
    app = create_app(counting, max_queries=8, max_k=20, max_body_bytes=4096)
    with BackgroundServer(app) as s:
        s.retriever = counting
        yield s


def test_hits_equal_direct_search(server, bm25, toy_world):
    queries = [q.query for q in toy_world.test] + ["", "no known words zzzz"]
    with RetrieverClient(server.url, max_queries=8) as client:
        got = client.search(queries, 5)  # split into requests of at most 8 queries
        assert got == bm25.search(queries, 5)
        assert all(isinstance(h, Hit) for row in got for h in row)
        assert client.search(queries[:3], 20) == bm25.search(queries[:3], 20)
        assert client.search([], 5) == []
        assert client.health()["status"] == "ok"


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({"queries": ["a"], "k": 0}, 422, "k"),
        ({"queries": ["a"], "k": 21}, 422, "k"),
        ({"queries": ["a"], "k": "5"}, 422, "k"),
        ({"queries": "not a list", "k": 5}, 422, "queries"),
        ({"queries": [1, 2], "k": 5}, 422, "queries"),
        ({"k": 5}, 422, "queries"),
        ({"queries": ["a"], "k": 5, "extra": True}, 422, "extra"),
        ({"queries": ["q"] * 9, "k": 5}, 413, None),
        ({"queries": ["x" * 5000], "k": 5}, 413, None),
    ],
)
def test_bad_requests_get_4xx(server, body, status, field):
    r = httpx.post(f"{server.url}/search", json=body)
    assert r.status_code == status, r.text
    if field is not None:
        assert r.json()["detail"][0]["loc"][0] == field


def test_malformed_and_oversized_bodies(server):
    r = httpx.post(f"{server.url}/search", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    # a body streamed without a content-length is cut off at the limit too
    r = httpx.post(f"{server.url}/search", content=iter([b'{"queries": ["', b"y" * 5000, b'"], "k": 1}']))
    assert r.status_code == 413
    r = httpx.get(f"{server.url}/search")
    assert r.status_code == 405


def test_client_raises_clear_errors_on_4xx(server):
    with RetrieverClient(server.url, max_queries=100) as client:
        with pytest.raises(InputError, match="HTTP 413"):
            client.search(["q"] * 9, 5)
        with pytest.raises(InputError, match="HTTP 422") as err:
            client.search(["q"], 50)
        assert err.value.field == "k"


def test_concurrent_requests_are_coalesced(bm25, toy_world):
    counting = CountingRetriever(bm25, delay=0.05)
    queries = [q.query for q in toy_world.single_hop[:16]]
    results: dict[int, list[list[Hit]]] = {}
    with BackgroundServer(create_app(counting, max_wait_ms=5)) as s:
        barrier = threading.Barrier(len(queries))

        def one(i: int) -> None:
            with RetrieverClient(s.url) as client:
                barrier.wait()
                results[i] = client.search([queries[i]], 3)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(queries))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert [results[i][0] for i in range(len(queries))] == bm25.search(queries, 3)
    assert sum(counting.sizes) == len(queries)
    assert counting.calls < len(queries)
    assert max(counting.sizes) > 1


def test_search_failure_is_a_500_and_the_service_keeps_serving(bm25):
    with BackgroundServer(create_app(FailingRetriever())) as s:
        with RetrieverClient(s.url, retries=0) as client, pytest.raises(httpx.HTTPStatusError):
            client.search(["q"], 1)
        assert httpx.get(f"{s.url}/health").json()["status"] == "ok"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_client_retries_until_the_service_is_up(bm25):
    port = free_port()
    with RetrieverClient(f"http://127.0.0.1:{port}", retries=0) as client, pytest.raises(ConnectionError):
        client.search(["q"], 1)

    app = create_app(bm25)
    started: list[BackgroundServer] = []

    def start_later() -> None:
        time.sleep(0.3)
        started.append(BackgroundServer(app, port=port).__enter__())

    thread = threading.Thread(target=start_later)
    thread.start()
    try:
        with RetrieverClient(f"http://127.0.0.1:{port}", retries=8, backoff_s=0.1) as client:
            assert client.search(["What is the country of Netu?"], 3) == bm25.search(
                ["What is the country of Netu?"], 3
            )
    finally:
        thread.join()
        for s in started:
            s.__exit__(None, None, None)


def test_serve_retriever_command(bm25, toy_world, tmp_path):
    build_bm25_folder([toy_world.passages], tmp_path / "bm25")
    port = free_port()
    cmd = [sys.executable, "-m", "corag.cli", "serve-retriever", str(tmp_path / "bm25"), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = load_retriever(f"http://127.0.0.1:{port}", retries=40, backoff_s=0.05)
        assert isinstance(client, RetrieverClient)
        queries = ["What is the country of Netu?", "Who founded Fithudus?"]
        assert client.search(queries, 4) == bm25.search(queries, 4)
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_official_api_is_served_beside_ours(bm25, toy_world):
    """`POST /` with {"query"} answers [{"doc_id", "score"}] at the service's top-k, as the official
    E5 server does, coalesced with the batched API's searches."""
    counting = CountingRetriever(bm25)
    queries = [q.query for q in toy_world.single_hop[:6]]
    with BackgroundServer(create_app(counting, official_k=4, max_wait_ms=20)) as s:
        rows = [httpx.post(f"{s.url}/", json={"query": q}).json() for q in queries]
        assert rows == [
            [{"doc_id": h.doc_id, "score": h.score} for h in hits] for hits in bm25.search(queries, 4)
        ]
        assert httpx.post(f"{s.url}/", json={"queries": queries}).status_code == 422
        assert httpx.post(f"{s.url}/", json={"query": 3}).status_code == 422
        assert httpx.get(f"{s.url}/health").json()["official_k"] == 4


class OfficialQuery(BaseModel):
    query: str


def official_server(retriever, top_k: int, rows: dict[str, int]):
    """A stand-in for the official CoRAG E5 server's HTTP surface: POST / only, doc ids as corpus row
    numbers (JSON numbers)."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/")
    async def search(request: OfficialQuery) -> list[dict]:
        (hits,) = retriever.search([request.query], top_k)
        return [{"doc_id": rows[h.doc_id], "score": h.score} for h in hits]

    return app


def test_client_reads_an_official_server(bm25, toy_world, capsys):
    queries = [q.query for q in toy_world.single_hop[:10]]
    rows = {p.id: i for i, p in enumerate(toy_world.passages)}

    def want(qs, k):  # the row numbers come back as text
        return [[Hit(str(rows[h.doc_id]), h.score) for h in hits] for hits in bm25.search(qs, k)]

    with BackgroundServer(official_server(bm25, 5, rows)) as s, RetrieverClient(s.url) as client:
        assert client.search(queries, 3) == want(queries, 3)
        assert client.api == "official" and client.fingerprint() == ""
        assert client.search(queries[:2], 8) == want(queries[:2], 5)
        assert "fewer than the 8 hits" in capsys.readouterr().err
        assert client.search([], 3) == []
    server = official_server(bm25, 5, rows)
    with BackgroundServer(server) as s, RetrieverClient(s.url, api="corag", retries=0) as c:
        with pytest.raises(InputError, match="HTTP 404"):  # forced to our API, the official server has none
            c.search(queries[:1], 3)


def test_binding_beyond_loopback_needs_allow_remote(tmp_path, bm25, toy_world, capsys):
    from corag.commands.serve_retriever import main

    with pytest.raises(SystemExit):
        main([str(tmp_path), "--host", "0.0.0.0"])
    assert "--allow-remote" in capsys.readouterr().err


def test_serve_retriever_with_several_workers(toy_world, tmp_path):
    build_bm25_folder([toy_world.passages], tmp_path / "bm25")
    port = free_port()
    cmd = [
        sys.executable, "-m", "corag.cli", "serve-retriever", str(tmp_path / "bm25"), "--port", str(port),
        "--workers", "2",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with RetrieverClient(f"http://127.0.0.1:{port}", retries=60, backoff_s=0.1) as client:
            queries = ["What is the country of Netu?", "Who founded Fithudus?"]
            want = BM25Retriever.load(tmp_path / "bm25").search(queries, 4)
            assert all(client.search(queries, 4) == want for _ in range(6))
            assert client.fingerprint()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_lone_request_does_not_wait_for_company(bm25):
    """The coalescing wait applies only while other requests are on their way in: with a wait of a
    minute, one client's requests still come back (within the 20 s client timeout)."""
    counting = CountingRetriever(bm25)
    with BackgroundServer(create_app(counting, max_wait_ms=60_000)) as s:
        with RetrieverClient(s.url, timeout=20, retries=0) as client:
            for query in ["What is the country of Netu?", "Who founded Fithudus?"]:
                assert client.search([query], 3) == bm25.search([query], 3)
    assert counting.sizes == [1, 1]


def test_client_rides_out_a_service_restart_on_the_same_port(bm25, capsys):
    """The service stops and starts again on its port (a requeued job); the client waits with backoff,
    says so on stderr, and its search answers once the service is back."""
    port = free_port()
    url, queries = f"http://127.0.0.1:{port}", ["What is the country of Netu?"]
    first = BackgroundServer(create_app(bm25), port=port).__enter__()
    restarted: list[BackgroundServer] = []
    with RetrieverClient(url, timeout=20, retry_seconds=60, backoff_s=0.1, max_backoff_s=0.4) as c:
        assert c.search(queries, 3) == bm25.search(queries, 3)
        first.__exit__(None, None, None)

        def restart() -> None:
            time.sleep(1.5)
            restarted.append(BackgroundServer(create_app(bm25), port=port).__enter__())  # a new process's app

        thread = threading.Thread(target=restart)
        thread.start()
        try:
            assert c.search(queries, 3) == bm25.search(queries, 3)
        finally:
            thread.join()
            for s in restarted:
                s.__exit__(None, None, None)
    err = capsys.readouterr().err
    assert (
        f"retrieval service at http://127.0.0.1:{port} not answering" in err and "retrying for up to" in err
    )


def test_client_retry_budget_is_bounded_and_settable(monkeypatch):
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("CORAG_RETRIEVER_RETRY_SECONDS", "0.3")
    with RetrieverClient(dead, backoff_s=0.05) as client:
        assert client.retry_seconds == 0.3
        with pytest.raises(ConnectionError, match="retry budget 0 s"):
            client.search(["q"], 1)
    monkeypatch.delenv("CORAG_RETRIEVER_RETRY_SECONDS")
    assert RetrieverClient(dead).retry_seconds == 600  # minutes by default, not seconds
