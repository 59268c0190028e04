"""The retrieval service: same hits as direct search, request limits, coalescing, client retries, CLI."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

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
