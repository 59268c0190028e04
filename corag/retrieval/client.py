"""A Retriever that searches through `corag serve-retriever` over HTTP."""

from __future__ import annotations

import time
from collections.abc import Sequence

import httpx

from corag.errors import InputError
from corag.types import Hit


class RetrieverClient:
    """Sends searches to a retrieval service; retries connection failures and 503s with backoff.

    Large batches are split into requests of at most `max_queries` (the service's default limit).
    """

    def __init__(
        self,
        url: str,
        timeout: float = 120.0,
        retries: int = 5,
        backoff_s: float = 0.5,
        max_queries: int = 256,
    ) -> None:
        self.url = url.rstrip("/")
        self.retries, self.backoff_s, self.max_queries = retries, backoff_s, max_queries
        self.http = httpx.Client(timeout=timeout)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        hits: list[list[Hit]] = []
        for start in range(0, len(queries), self.max_queries):
            hits += self._post(list(queries[start : start + self.max_queries]), k)
        return hits

    def health(self) -> dict:
        return self.http.get(f"{self.url}/health").raise_for_status().json()

    def _post(self, queries: list[str], k: int) -> list[list[Hit]]:
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                r = self.http.post(f"{self.url}/search", json={"queries": queries, "k": k})
            except httpx.TransportError as e:  # refused, reset, timed out: the service may be restarting
                if last:
                    raise ConnectionError(f"retrieval service at {self.url} unreachable: {e}") from e
                time.sleep(self.backoff_s * 2**attempt)
                continue
            if r.status_code == 503 and not last:
                time.sleep(self.backoff_s * 2**attempt)
                continue
            if 400 <= r.status_code < 500:
                raise InputError(
                    f"retrieval service at {self.url} rejected the request (HTTP {r.status_code}): {_detail(r)}",
                    field=_field(r),
                )
            r.raise_for_status()
            rows = r.json()["hits"]
            return [[Hit(h["doc_id"], float(h["score"])) for h in row] for row in rows]
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RetrieverClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
