"""Inference methods beside CoRAG, run on the same executor, retriever, budget and evaluation.

Each is `async def method(ctx, example, *, corpus, **settings) -> dict` (a result record).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from corag.methods import baselines, ircot, search_r1, searchain

METHODS: dict[str, Callable[..., Coroutine[Any, Any, dict[str, Any]]]] = {
    "ircot": ircot.ircot,
    "searchain": searchain.searchain,
    "search-r1": search_r1.search_r1,
    "one_step": baselines.one_step,
    "no_retrieval": baselines.no_retrieval,
}
