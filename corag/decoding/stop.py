"""Learned stopping (the CoRAG paper's early exit), usable with any strategy.

Every strategy takes `stop_bias`: after each step the model is asked whether the chain so far is
enough to answer (corag.chain.should_stop); "Yes" with the bias b added ends the chain. Larger b
stops earlier and saves tokens; None never asks.
"""

from __future__ import annotations

from typing import Any

from corag.chain import CorpusLike, DecodeResult
from corag.executor import Context
from corag.types import Example


async def with_learned_stop(
    strategy: Any, ctx: Context, example: Example, corpus: CorpusLike, bias: float, **kwargs: Any
) -> DecodeResult:
    """Run `strategy` with the learned stop at bias `bias`."""
    result: DecodeResult = await strategy(ctx, example, corpus, stop_bias=bias, **kwargs)
    result.extras["stop_bias"] = bias
    return result
