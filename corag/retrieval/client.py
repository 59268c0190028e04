"""A Retriever that searches through `corag serve-retriever`, the official CoRAG E5 server or a Search-R1
retrieval server, over HTTP."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from corag.errors import InputError
from corag.types import Hit

APIS = ("auto", "corag", "official", "search-r1")
RETRIEVE_PATH = "/retrieve"  # Search-R1's endpoint; a URL that ends with it names that API
RETRY_ENV = "CORAG_RETRIEVER_RETRY_SECONDS"  # the retry budget of every client a command opens
RETRY_SECONDS = 600.0  # long enough for a service job to be requeued and load its index again


def default_retry_seconds() -> float:
    """The retry budget: $CORAG_RETRIEVER_RETRY_SECONDS, else 10 minutes."""
    text = os.environ.get(RETRY_ENV, "").strip()
    try:
        return float(text) if text else RETRY_SECONDS
    except ValueError:
        raise InputError(f"not a number of seconds: {text!r}", field=RETRY_ENV) from None


class RetrieverClient:
    """Sends searches to a retrieval service; retries connection failures and 503s with backoff.

    A service that goes away (a requeued or restarted job) is waited for: requests are retried with
    exponential backoff (at most `max_backoff_s` apart) for `retry_seconds` in all (default 10 minutes,
    or $CORAG_RETRIEVER_RETRY_SECONDS), with a line on stderr while waiting; `retries` also caps the
    number of attempts (0: fail at once).

    `api="corag"` speaks `corag serve-retriever`'s batched API: large batches are split into requests
    of at most `max_queries` (the service's default limit). `api="official"` speaks the official CoRAG
    E5 server's (`POST /` with {"query"} answering [{"doc_id", "score"}], its top-k fixed by the
    server): one request per query, `concurrency` at a time, each cut to k (a server whose top-k is
    smaller returns fewer hits, with a warning). `api="search-r1"` speaks Search-R1's retrieval server
    (search_r1/search/retrieval_server.py: `POST /retrieve` with {"queries", "topk", "return_scores"},
    answering {"result": [[{"document": {"id", "contents"}, "score"}]]}), each document's `id` taken as
    the corpus id. `api="auto"` takes a URL ending in `/retrieve` (as Search-R1's configs write it,
    `http://127.0.0.1:8000/retrieve`) for Search-R1's API, and otherwise asks /health, which only ours
    answers.
    """

    def __init__(
        self,
        url: str,
        timeout: float = 120.0,
        retry_seconds: float | None = None,
        backoff_s: float = 0.5,
        max_backoff_s: float = 15.0,
        retries: int | None = None,
        max_queries: int = 256,
        api: str = "auto",
        concurrency: int = 16,
    ) -> None:
        if api not in APIS:
            raise InputError(f"unknown retrieval API {api!r}; choose one of {APIS}", field="api")
        self.url = url.rstrip("/")
        if api in ("auto", "search-r1") and self.url.endswith(RETRIEVE_PATH):
            self.url, api = self.url[: -len(RETRIEVE_PATH)], "search-r1"
        self.retry_seconds = default_retry_seconds() if retry_seconds is None else retry_seconds
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self.max_queries = max_queries
        self.http = httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=max(concurrency, 1)))
        self.api, self.concurrency = api, concurrency
        self._warned_short = False

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        api = self._api()
        if api == "official":
            return self._search_official(list(queries), k)
        post = self._post_search_r1 if api == "search-r1" else self._post
        hits: list[list[Hit]] = []
        for start in range(0, len(queries), self.max_queries):
            hits += post(list(queries[start : start + self.max_queries]), k)
        return hits

    def health(self) -> dict:
        return self.http.get(f"{self.url}/health").raise_for_status().json()

    def fingerprint(self) -> str:
        """The index fingerprint the service reports ("" for a server that reports none)."""
        if self._api() in ("official", "search-r1"):
            return ""
        return str(self._request("GET", "/health", None).json().get("index", ""))

    def _api(self) -> str:
        """The API the server speaks; "auto" is settled by the first answer to GET /health."""
        if self.api == "auto":
            r = self._request("GET", "/health", None)
            self.api = "official" if r.status_code == 404 else "corag"
        return self.api

    def _search_official(self, queries: list[str], k: int) -> list[list[Hit]]:
        def one(query: str) -> list[Hit]:
            rows = self._request("POST", "/", {"query": query}).json()
            return [_hit(h) for h in rows][:k]

        if not queries:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(queries))) as pool:
            hits = list(pool.map(one, queries))
        if any(len(row) < k for row in hits) and not self._warned_short:
            self._warned_short = True
            print(
                f"warning: the retrieval server at {self.url} returned fewer than the {k} hits asked for "
                "(its top-k is set on the server)",
                file=sys.stderr,
            )
        return hits

    def _post(self, queries: list[str], k: int) -> list[list[Hit]]:
        rows = self._request("POST", "/search", {"queries": queries, "k": k}).json()["hits"]
        return [[_hit(h) for h in row] for row in rows]

    def _post_search_r1(self, queries: list[str], k: int) -> list[list[Hit]]:
        body = {"queries": queries, "topk": k, "return_scores": True}
        rows = self._request("POST", RETRIEVE_PATH, body).json().get("result")
        if not isinstance(rows, list) or len(rows) != len(queries):
            raise InputError(
                f"the Search-R1 server at {self.url} answered {len(queries)} queries with {rows!r:.80}",
                field="result",
            )
        return [[_retrieved_hit(item, self.url) for item in row] for row in rows]

    def _request(self, method: str, path: str, body: dict | None) -> httpx.Response:
        """One request, retried while the service is unreachable or busy (503) within the retry budget;
        a 4xx is an InputError, a 404 on /health is returned as is."""
        start = time.monotonic()
        next_note = start
        attempt = 0
        while True:
            try:
                r = self.http.request(method, f"{self.url}{path}", json=body)
                problem = f"HTTP {r.status_code}" if r.status_code == 503 else ""
            except httpx.TransportError as e:  # refused, reset, timed out: the service may be restarting
                r, problem = None, f"{type(e).__name__}: {e}"
            if not problem:
                break
            waited = time.monotonic() - start
            delay = min(self.backoff_s * 2**attempt, self.max_backoff_s)
            out_of_budget = waited + delay > self.retry_seconds
            if out_of_budget or (self.retries is not None and attempt >= self.retries):
                if r is not None:
                    return r.raise_for_status()
                raise ConnectionError(
                    f"retrieval service at {self.url} unreachable after {waited:.0f} s of retries "
                    f"(retry budget {self.retry_seconds:.0f} s, {RETRY_ENV}): {problem}"
                )
            if time.monotonic() >= next_note:
                print(
                    f"retrieval service at {self.url} not answering ({problem}); retrying for up to "
                    f"{self.retry_seconds - waited:.0f} s more",
                    file=sys.stderr,
                    flush=True,
                )
                next_note = time.monotonic() + 60
            time.sleep(delay)
            attempt += 1
        if r.status_code == 404 and path == "/health":
            return r
        if 400 <= r.status_code < 500:
            raise InputError(
                f"retrieval service at {self.url} rejected the request (HTTP {r.status_code}): {_detail(r)}",
                field=_field(r),
            )
        return r.raise_for_status()

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RetrieverClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _hit(h: dict) -> Hit:
    """A hit from either API; doc ids may come as numbers (corpus row numbers) and are kept as text."""
    return Hit(str(h["doc_id"]), float(h["score"]))


def _retrieved_hit(item: object, url: str) -> Hit:
    """A hit from Search-R1's API: `{"document": {"id", ...}, "score"}`; the document's id is the corpus id."""
    document = item.get("document") if isinstance(item, dict) else None
    if not isinstance(document, dict) or "id" not in document or "score" not in item:
        raise InputError(
            f"the Search-R1 server at {url} answered a hit without document.id or score: {item!r:.80}",
            field="result",
        )
    return Hit(str(document["id"]), float(item["score"]))


def _detail(r: httpx.Response) -> str:
    try:
        return str(r.json().get("detail", r.text))
    except ValueError:
        return r.text


def _field(r: httpx.Response) -> str | None:
    """The request field a 422 names (e.g. 'k' or 'queries'), if any."""
    try:
        detail = r.json().get("detail")
        return str(detail[0]["loc"][0]) if isinstance(detail, list) and detail and detail[0]["loc"] else None
    except (ValueError, KeyError, TypeError):
        return None


def answers_health(url: str, timeout: float = 10.0) -> bool:
    """Whether a retrieval service at `url` answers GET /health now."""
    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=timeout).raise_for_status()
    except httpx.HTTPError:
        return False
    return True


def wait_for_service(
    url_file: str | Path, timeout_s: float, poll_s: float = 2.0, alive: Callable[[], bool] | None = None
) -> str:
    """The URL a retrieval service job writes to `url_file` (sampling/serve_retriever.sh), once the file
    exists and the service answers GET /health; waited for at most `timeout_s`, with a line on stderr a
    minute. Launchers call this at run time, so a job may start before the service (or be requeued).
    With `alive` (the service is this job's own process), a service that has exited ends the wait."""
    path = Path(url_file)
    start = time.monotonic()
    next_note = start
    url, problem = "", f"{path} not written yet"
    while True:
        if path.is_file():
            url = path.read_text().strip()  # read again each time: a restarted service may write a new one
            problem = f"{url or '(empty)'} (from {path}) not answering /health"
            if url.startswith(("http://", "https://")) and answers_health(url):
                return url
        waited = time.monotonic() - start
        if alive is not None and not alive():
            raise InputError("the retrieval service exited before answering (see its log)", file=str(path))
        if waited >= timeout_s:
            where = (
                "was never written"
                if not path.is_file()
                else f"names {url or '(empty)'}, which never answered"
            )
            raise InputError(
                f"no retrieval service after {timeout_s / 60:g} min: the URL file {where} (start "
                "sampling/serve_retriever.sh first, or wait longer with --wait-minutes)",
                file=str(path),
            )
        if time.monotonic() >= next_note:
            print(
                f"waiting for the retrieval service: {problem} ({waited:.0f} s so far)",
                file=sys.stderr,
                flush=True,
            )
            next_note = time.monotonic() + 60
        time.sleep(min(poll_s, max(timeout_s - waited, 0.01)))
