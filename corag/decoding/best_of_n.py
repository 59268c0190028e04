"""Best-of-N (as in the CoRAG paper): N chains, the first greedy, the rest sampled; keep the lowest penalty."""

from __future__ import annotations

from corag.chain import CorpusLike, DecodeResult, GenerationLimits, finish, open_question, safe_penalty
from corag.decoding.greedy import check_max_steps, sample_chain
from corag.errors import InputError
from corag.executor import Context
from corag.prompts import FINAL_NUM_DOCS
from corag.types import Example

SAMPLE_TEMPERATURE = 0.7


async def best_of_n(
    ctx: Context,
    example: Example,
    corpus: CorpusLike,
    *,
    max_steps: int = 6,
    n: int = 4,
    stop_bias: float | None = None,
    task_desc: str | None = None,
    docs: int = FINAL_NUM_DOCS,
    final_docs: str = "auto",
    limits: GenerationLimits | None = None,
) -> DecodeResult:
    """Sample N chains concurrently, score each with the penalty, answer from the argmin chain.

    Chains the budget left unscored rank last; if none was scored, the greedy chain is kept.
    """
    check_max_steps(max_steps)
    if n < 1:
        raise InputError(f"the number of chains N must be 1 or more, got {n}", field="n")
    question = await open_question(ctx, example, corpus, task_desc, docs, final_docs, limits)
    grown = await ctx.gather(
        *(
            sample_chain(
                ctx,
                question,
                max_steps=max_steps,
                temperature=0.0 if i == 0 else SAMPLE_TEMPERATURE,
                chain=i,
                stop_bias=stop_bias,
            )
            for i in range(n)
        )
    )
    chains = [g.steps for g in grown]
    penalties = await ctx.gather(*(safe_penalty(ctx, question.query, chain) for chain in chains))
    scored = [i for i, p in enumerate(penalties) if p is not None]
    best = min(scored, key=lambda i: penalties[i]) if scored else 0
    extras = {
        "penalties": penalties,
        "best_chain": best,
        "chains": [[{"subquery": s.subquery, "subanswer": s.subanswer} for s in chain] for chain in chains],
    }
    return await finish(ctx, question, example, "best_of_n", chains[best], extras)
