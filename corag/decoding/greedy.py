"""Greedy decoding (as in the CoRAG paper): L steps at temperature 0, then the final answer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    stop_choice,
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


@dataclass(frozen=True)
class Growth:
    """A grown chain's steps, and whether the learned stop ended it (a Yes; running out of calls, budget or
    steps is not a stop)."""

    steps: tuple[Step, ...]
    stopped: bool = False


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
    subanswer_temperature: float = 0.0,
    sample_stop: bool = False,
    mark: Callable[[str], None] | None = None,
) -> Growth:
    """Grow a chain from `steps` to at most `max_steps` steps: the one rule of decoding and of training's
    rollouts (corag.training.rollout grows its chains here).

    A sub-query that repeats an earlier one is discarded and asked again at max(t, 0.7) (the official
    agent's rule); at most 4 sub-query calls per step to add. Sub-answers are greedy unless given a
    temperature. With `stop_bias`, the learned stop is asked after each step but the last: the likelier
    turn with the bias, or with `sample_stop` (a rollout) drawn with its share (corag.chain.stop_choice,
    the same scores). With `for_final`, a step is only taken while the final answer over the chain still
    fits the budget (rollouts, never answered, skip that). Running out of budget ends the chain with the
    steps so far. `mark(kind)` follows each model call ("subquery", "subanswer", "stop").
    """
    steps = list(steps)
    note = mark or (lambda kind: None)
    max_calls = 4 * (max_steps - len(steps))
    temp, calls, stopped = temperature, 0, False
    try:
        while len(steps) < max_steps and calls < max_calls:
            calls += 1
            seed = call_seed(question.id, chain, len(steps), calls)
            query = await next_subquery(
                ctx, question.query, steps, question.task_desc, temp, seed, question.limits
            )
            note("subquery")
            if query in {s.subquery for s in steps}:
                temp = max(temp, RETRY_TEMPERATURE)
                continue
            temp = temperature
            step = await subanswer(
                ctx, query, question.corpus, limits=question.limits, temperature=subanswer_temperature,
                seed=seed + 1,
            )  # fmt: skip
            note("subanswer")
            if for_final and not keep_room_for_final(ctx, question, [*steps, step]):
                break
            steps.append(step)
            if stop_bias is None or len(steps) >= max_steps:
                continue
            if sample_stop:
                stopped = await stop_choice(ctx, question.query, steps, question.task_desc, True, seed + 2)
            else:
                stopped = await should_stop(ctx, question.query, steps, question.task_desc, stop_bias)
            note("stop")
            if stopped:
                break
    except BudgetExceeded:
        pass
    return Growth(tuple(steps), stopped)


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
    grown = await sample_chain(ctx, question, max_steps=max_steps, temperature=0.0, stop_bias=stop_bias)
    return await finish(ctx, question, example, "greedy", grown.steps)
