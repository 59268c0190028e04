"""A Retriever that searches through `corag serve-retriever`, or the official CoRAG E5 server, over HTTP."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from corag.errors import InputError
from corag.types import Hit

APIS = ("auto", "corag", "official")


class RetrieverClient:
    """Sends searches to a retrieval service; retries connection failures and 503s with backoff.

    `api="corag"` speaks `corag serve-retriever`'s batched API: large batches are split into requests
    of at most `max_queries` (the service's default limit). `api="official"` speaks the official CoRAG
    E5 server's (`POST /` with {"query"} answering [{"doc_id", "score"}], its top-k fixed by the
    server): one request per query, `concurrency` at a time, each cut to k (a server whose top-k is
    smaller returns fewer hits, with a warning). `api="auto"` asks /health, which only ours answers.
    """

    def __init__(
        self,
        url: str,
        timeout: float = 120.0,
        retries: int = 5,
        backoff_s: float = 0.5,
        max_queries: int = 256,
        api: str = "auto",
        concurrency: int = 16,
    ) -> None:
        if api not in APIS:
            raise InputError(f"unknown retrieval API {api!r}; choose one of {APIS}", field="api")
        self.url = url.rstrip("/")
        self.retries, self.backoff_s, self.max_queries = retries, backoff_s, max_queries
        self.http = httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=max(concurrency, 1)))
        self.api, self.concurrency = api, concurrency
        self._warned_short = False

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if self._api() == "official":
            return self._search_official(list(queries), k)
        hits: list[list[Hit]] = []
        for start in range(0, len(queries), self.max_queries):
            hits += self._post(list(queries[start : start + self.max_queries]), k)
        return hits

    def health(self) -> dict:
        return self.http.get(f"{self.url}/health").raise_for_status().json()

    def fingerprint(self) -> str:
        """The index fingerprint the service reports ("" for a server that reports none)."""
        if self._api() == "official":
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

    def _request(self, method: str, path: str, body: dict | None) -> httpx.Response:
        """One request with retries; a 4xx is an InputError, a 404 on /health is returned as is."""
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                r = self.http.request(method, f"{self.url}{path}", json=body)
            except httpx.TransportError as e:  # refused, reset, timed out: the service may be restarting
                if last:
                    raise ConnectionError(f"retrieval service at {self.url} unreachable: {e}") from e
                time.sleep(self.backoff_s * 2**attempt)
                continue
            if r.status_code == 503 and not last:
                time.sleep(self.backoff_s * 2**attempt)
                continue
            if r.status_code == 404 and path == "/health":
                return r
            if 400 <= r.status_code < 500:
                raise InputError(
                    f"retrieval service at {self.url} rejected the request (HTTP {r.status_code}): {_detail(r)}",
                    field=_field(r),
                )
            return r.raise_for_status()
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RetrieverClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _hit(h: dict) -> Hit:
    """A hit from either API; doc ids may come as numbers (corpus row numbers) and are kept as text."""
    return Hit(str(h["doc_id"]), float(h["score"]))


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
