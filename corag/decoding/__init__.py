"""Decoding strategies: each an `async def strategy(ctx, example, corpus, *, max_steps, ...)` for one
question, run for many questions at once by corag.executor.Executor."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from corag.decoding.best_of_n import best_of_n
from corag.decoding.greedy import greedy
from corag.decoding.tree_search import tree_search
from corag.errors import InputError

STRATEGIES: dict[str, Callable[..., Coroutine[Any, Any, Any]]] = {
    "greedy": greedy,
    "best_of_n": best_of_n,
    "tree_search": tree_search,
}


def get_strategy(name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
    """The strategy called `name`, or an InputError listing the known ones."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise InputError(
            f"unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}", field="strategy"
        ) from None
