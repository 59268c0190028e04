"""Search-R1's retrieval API both ways: `corag serve-retriever --corpus` answers `POST /retrieve` as the
release's retrieval_server.py does (read by a client written from the release's JSON shapes), and the
project's client searches a stand-in server that answers as the release's does."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from corag.data.corpus import Corpus
from corag.errors import InputError
from corag.prompts import search_r1_information
from corag.retrieval import load_retriever
from corag.retrieval.bm25 import BM25Retriever
from corag.retrieval.client import RetrieverClient
from corag.retrieval.index import build_bm25
from corag.retrieval.service import BackgroundServer, create_app
from corag.types import Hit

from .test_service import free_port

# The release's shapes (search_r1/search/retrieval_server.py: `QueryRequest` and `retrieve_endpoint`;
# search_r1/llm_agent/generation.py: `_batch_search` sends queries, topk and return_scores=True).


class UpstreamDocument(BaseModel):
    id: str
    contents: str


class UpstreamScored(BaseModel):
    document: UpstreamDocument
    score: float


class UpstreamScoredAnswer(BaseModel):
    result: list[list[UpstreamScored]]


class UpstreamAnswer(BaseModel):
    result: list[list[UpstreamDocument]]


def upstream_passages2string(hits: list[UpstreamScored]) -> str:
    """generation.py's `_passages2string`: the first line of `contents` is the title, the rest the text."""
    out = ""
    for i, hit in enumerate(hits):
        lines = hit.document.contents.split("\n")
        out += f"Doc {i + 1}(Title: {lines[0]}) {chr(10).join(lines[1:])}\n"
    return out


@pytest.fixture(scope="module")
def wiki(toy_world, tmp_path_factory):
    """The toy world's passages written as wiki-18 is (`{"id", "contents": "\\"Title\\"\\ntext"}`), its
    corpus and a BM25 index over it."""
    folder = tmp_path_factory.mktemp("wiki")
    lines = {p.id: {"id": p.id, "contents": f'"{p.title}"\n{p.contents}'} for p in toy_world.passages}
    (folder / "wiki.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines.values()))
    corpus = Corpus.load(folder / "wiki.jsonl", cache_dir=folder / "cache")
    build_bm25(corpus, folder / "bm25")
    return folder, corpus, lines


def test_an_upstream_client_reads_serve_retriever(wiki, toy_world):
    folder, corpus, lines = wiki
    port = free_port()
    cmd = [
        sys.executable, "-m", "corag.cli", "serve-retriever", str(folder / "bm25"), "--port", str(port),
        "--corpus", str(folder / "wiki.jsonl"),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        with RetrieverClient(url, retries=60, backoff_s=0.1) as ours:
            assert ours.fingerprint()  # waits for the service
            queries = [q.query for q in toy_world.test[:8]]
            searched = ours.search(queries, 5)
        body = {"queries": queries, "topk": 5, "return_scores": True}
        answer = UpstreamScoredAnswer.model_validate(httpx.post(f"{url}/retrieve", json=body).json())
        assert [[h.document.id for h in row] for row in answer.result] == [
            [h.doc_id for h in row] for row in searched
        ]
        assert [[h.score for h in row] for row in answer.result] == [
            [h.score for h in row] for row in searched
        ]
        for row in answer.result:  # each document is its corpus line, as wiki-18 stores it
            assert all(h.document.model_dump() == lines[h.document.id] for h in row)
        # the release's prompt text from the server's answer equals the method's own
        for row, hits in zip(answer.result, searched, strict=True):
            passages = corpus.get_many([h.doc_id for h in hits])
            want = search_r1_information(passages)
            assert f"\n\n<information>{upstream_passages2string(row).strip()}</information>\n\n" == want
        # without scores: the documents alone; without topk: the server's default (3)
        plain = httpx.post(f"{url}/retrieve", json={"queries": queries[:2], "return_scores": False})
        documents = UpstreamAnswer.model_validate(plain.json()).result
        assert [[d.id for d in row] for row in documents] == [
            [h.doc_id for h in row[:3]] for row in searched[:2]
        ]
        assert (
            UpstreamAnswer.model_validate(httpx.post(f"{url}/retrieve", json={"queries": []}).json()).result
            == []
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def served(wiki):
    folder, corpus, _ = wiki
    app = create_app(BM25Retriever.load(folder / "bm25"), max_queries=4, max_k=20, corpus=corpus)
    with BackgroundServer(app) as s:
        yield s


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({"queries": ["a"], "topk": 0}, 422, "topk"),
        ({"queries": ["a"], "topk": "3"}, 422, "topk"),
        ({"queries": ["a"], "topk": 21}, 422, "topk"),
        ({"queries": ["a"], "return_scores": "yes"}, 422, "return_scores"),
        ({"queries": "a"}, 422, "queries"),
        ({"topk": 3}, 422, "queries"),
        ({"queries": ["a"], "top_k": 3}, 422, "top_k"),
        ({"queries": ["q"] * 5}, 413, None),
    ],
)
def test_bad_retrieve_requests_get_one_4xx(served, body, status, field):
    r = httpx.post(f"{served.url}/retrieve", json=body)
    assert r.status_code == status, r.text
    if field is not None:
        assert r.json()["detail"][0]["loc"][0] == field
    with RetrieverClient(f"{served.url}/retrieve", retries=0) as client, pytest.raises(InputError) as err:
        client.search(["q"], 0 if field == "topk" else 50)
    assert "HTTP 422" in str(err.value) and err.value.field == "topk" and "\n" not in str(err.value)


def test_retrieve_needs_the_corpus(wiki):
    folder, _, _ = wiki
    with BackgroundServer(create_app(BM25Retriever.load(folder / "bm25"))) as s:
        r = httpx.post(f"{s.url}/retrieve", json={"queries": ["a"]})
        assert r.status_code == 404 and "--corpus" in r.json()["detail"]


def test_serve_retriever_refuses_another_corpus(wiki, toy_world, tmp_path):
    from corag.retrieval.service import build_app

    folder, _, lines = wiki
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in list(lines.values())[:-1]))
    options = {"index": str(folder / "bm25"), "corpus": str(other), "max_queries": 8, "max_k": 10}
    options |= {"max_body_bytes": 4096, "max_batch": 8, "max_wait_ms": 1.0, "official_k": 3}
    with pytest.raises(InputError, match="built over another corpus"):
        build_app(options)


class StandInRequest(BaseModel):
    """The release's `QueryRequest`, as its server declares it."""

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


def stand_in_server(retriever, lines: dict[str, dict], default_k: int = 3) -> FastAPI:
    """A stand-in for Search-R1's retrieval server: `POST /retrieve` only, documents as corpus lines."""
    app = FastAPI()
    app.state.requests = []

    @app.post("/retrieve")
    async def retrieve(request: StandInRequest) -> dict:
        app.state.requests.append(request.model_dump())
        k = request.topk or default_k
        hits = retriever.search(request.queries, k)
        if request.return_scores:
            return {
                "result": [[{"document": lines[h.doc_id], "score": h.score} for h in row] for row in hits]
            }
        return {"result": [[lines[h.doc_id] for h in row] for row in hits]}

    return app


def test_the_client_searches_a_search_r1_server(wiki, toy_world):
    folder, _, lines = wiki
    bm25 = BM25Retriever.load(folder / "bm25")
    queries = [q.query for q in toy_world.test[:10]]
    app = stand_in_server(bm25, lines)
    with BackgroundServer(app) as s:
        client = load_retriever(f"{s.url}/retrieve", max_queries=4)
        assert isinstance(client, RetrieverClient) and client.api == "search-r1"
        assert client.search(queries, 4) == bm25.search(queries, 4)
        assert all(isinstance(h, Hit) for row in client.search(queries[:1], 2) for h in row)
        assert client.search([], 3) == [] and client.fingerprint() == ""
        assert [len(r["queries"]) for r in app.state.requests[:3]] == [4, 4, 2]  # split at max_queries
        assert app.state.requests[0] | {"queries": []} == {"queries": [], "topk": 4, "return_scores": True}
        client.close()
        with RetrieverClient(s.url, api="search-r1") as named:  # the API named, the URL without its path
            assert named.search(queries[:2], 3) == bm25.search(queries[:2], 3)


def test_the_client_refuses_an_answer_not_in_the_release_shape(wiki):
    app = FastAPI()

    @app.post("/retrieve")
    async def retrieve(request: StandInRequest) -> dict:
        return {"result": [[{"id": "0", "contents": "no document field"}] for _ in request.queries]}

    with BackgroundServer(app) as s, RetrieverClient(f"{s.url}/retrieve") as client:
        with pytest.raises(InputError, match="without document.id or score"):
            client.search(["q"], 1)
