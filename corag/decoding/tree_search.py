"""Tree search (as in the CoRAG paper): expand sampled sub-queries, score each by rollouts, keep the best."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean

from corag.budget import BudgetExceeded
from corag.chain import (
    CorpusLike,
    DecodeResult,
    GenerationLimits,
    Question,
    call_seed,
    finish,
    keep_room_for_final,
    open_question,
    safe_penalty,
    should_stop,
    subanswer,
    subquery_candidates,
)
from corag.decoding.greedy import check_max_steps, sample_chain
from corag.executor import Context
from corag.prompts import FINAL_NUM_DOCS
from corag.types import Example, Step

SAMPLE_TEMPERATURE = 0.7
EXPAND = 6  # candidate sub-queries sampled per step
KEEP = 4  # expansion size after de-duplication
ROLLOUTS = 2  # rollouts scoring each candidate
ROLLOUT_STEPS = 2  # steps a rollout may add
# beam size 1: one candidate survives each step


async def rollout_score(
    ctx: Context, question: Question, steps: Sequence[Step], max_steps: int, label: str
) -> float | None:
    """Mean penalty of ROLLOUTS sampled continuations of `steps` (at most ROLLOUT_STEPS more steps,
    never past L). At the last step there is nothing to continue, so the chain itself is scored once.
    None when the budget left no rollout scored."""
    more = min(ROLLOUT_STEPS, max_steps - len(steps))
    if more == 0:
        return await safe_penalty(ctx, question.query, steps)
    rollouts = await ctx.gather(
        *(
            sample_chain(
                ctx,
                question,
                steps,
                max_steps=len(steps) + more,
                temperature=SAMPLE_TEMPERATURE,
                chain=f"{label}/rollout{r}",
                for_final=False,
            )
            for r in range(ROLLOUTS)
        )
    )
    penalties = await ctx.gather(*(safe_penalty(ctx, question.query, g.steps) for g in rollouts))
    scored = [p for p in penalties if p is not None]
    return mean(scored) if scored else None


async def tree_search(
    ctx: Context,
    example: Example,
    corpus: CorpusLike,
    *,
    max_steps: int = 6,
    stop_bias: float | None = None,
    task_desc: str | None = None,
    docs: int = FINAL_NUM_DOCS,
    final_docs: str = "auto",
    limits: GenerationLimits | None = None,
) -> DecodeResult:
    """L steps, each chosen among up to 4 distinct sampled sub-queries by the mean penalty of rollouts."""
    check_max_steps(max_steps)
    question = await open_question(ctx, example, corpus, task_desc, docs, final_docs, limits)
    steps: tuple[Step, ...] = ()
    tree: list[list[dict[str, object]]] = []  # per step: each candidate and its score
    try:
        for i in range(max_steps):
            seed = call_seed(question.id, "tree", i, 0)
            texts = await subquery_candidates(
                ctx,
                question.query,
                steps,
                question.task_desc,
                EXPAND,
                SAMPLE_TEMPERATURE,
                seed,
                question.limits,
            )
            candidates = list(dict.fromkeys(texts))[:KEEP]
            new_steps = await ctx.gather(
                *(subanswer(ctx, q, corpus, limits=question.limits) for q in candidates)
            )
            scores = await ctx.gather(
                *(
                    rollout_score(ctx, question, (*steps, step), max_steps, f"tree/{i}/{c}")
                    for c, step in enumerate(new_steps)
                )
            )
            tree.append([{"subquery": q, "score": s} for q, s in zip(candidates, scores, strict=True)])
            ranked = sorted(range(len(new_steps)), key=lambda c: (scores[c] is None, scores[c] or 0.0))
            best = next(
                (c for c in ranked if keep_room_for_final(ctx, question, (*steps, new_steps[c]))), None
            )
            if best is None:
                break
            steps = (*steps, new_steps[best])
            if (
                stop_bias is not None
                and i < max_steps - 1
                and await should_stop(ctx, question.query, steps, question.task_desc, stop_bias)
            ):
                break
    except BudgetExceeded:
        pass
    return await finish(ctx, question, example, "tree_search", steps, {"tree": tree})
