"""Greedy decoding (as in the CoRAG paper): L steps at temperature 0, then the final answer."""

from __future__ import annotations

from collections.abc import Sequence

from corag.budget import BudgetExceeded
from corag.chain import (
    CorpusLike,
    DecodeResult,
    GenerationLimits,
    Question,
    call_seed,
    finish,
    keep_room_for_final,
    next_subquery,
    open_question,
    should_stop,
    subanswer,
)
from corag.errors import InputError
from corag.executor import Context
from corag.prompts import FINAL_NUM_DOCS
from corag.types import Example, Step

RETRY_TEMPERATURE = 0.7


def check_max_steps(max_steps: int) -> None:
    if max_steps < 0:
        raise InputError(f"the number of steps L must be 0 or more, got {max_steps}", field="max_steps")


async def sample_chain(
    ctx: Context,
    question: Question,
    steps: Sequence[Step] = (),
    *,
    max_steps: int,
    temperature: float,
    chain: int | str = 0,
    stop_bias: float | None = None,
    for_final: bool = True,
) -> tuple[Step, ...]:
    """Grow a chain from `steps` to at most `max_steps` steps.

    A sub-query that repeats an earlier one is discarded and asked again at max(t, 0.7); at most
    4 sub-query calls per step to add. Sub-answers are greedy. With `stop_bias`, the learned stop is
    asked after each step but the last. With `for_final`, a step is only taken while the final
    answer over the chain still fits the budget (rollouts, never answered, skip that). Running out
    of budget ends the chain with the steps so far.
    """
    steps = list(steps)
    max_calls = 4 * (max_steps - len(steps))
    temp, calls = temperature, 0
    try:
        while len(steps) < max_steps and calls < max_calls:
            calls += 1
            seed = call_seed(question.id, chain, len(steps), calls)
            query = await next_subquery(
                ctx, question.query, steps, question.task_desc, temp, seed, question.limits
            )
            if query in {s.subquery for s in steps}:
                temp = max(temp, RETRY_TEMPERATURE)
                continue
            temp = temperature
            step = await subanswer(ctx, query, question.corpus, limits=question.limits)
            if for_final and not keep_room_for_final(ctx, question, [*steps, step]):
                break
            steps.append(step)
            if (
                stop_bias is not None
                and len(steps) < max_steps
                and await should_stop(ctx, question.query, steps, question.task_desc, stop_bias)
            ):
                break
    except BudgetExceeded:
        pass
    return tuple(steps)


async def greedy(
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
    """One greedy chain of up to L steps (L = 0 answers from the documents alone), then the answer."""
    check_max_steps(max_steps)
    question = await open_question(ctx, example, corpus, task_desc, docs, final_docs, limits)
    steps = await sample_chain(ctx, question, max_steps=max_steps, temperature=0.0, stop_bias=stop_bias)
    return await finish(ctx, question, example, "greedy", steps)
