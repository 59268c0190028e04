"""The step primitives of a retrieval chain (as in the CoRAG paper), each one model call or search on a Context.

Strategies in corag/decoding compose these; every call is metered and budget-checked by the Context.
Prompts come from corag.prompts with the LM as the truncator, so the documented truncation rules apply
with the model's own tokenizer.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from corag import tasks
from corag.budget import BudgetExceeded
from corag.errors import InputError
from corag.executor import Context
from corag.lm.base import (
    LM,
    ChoiceRequest,
    Completion,
    GenerationRequest,
    Message,
    Sample,
    Score,
    ScoreRequest,
)
from corag.prompts import (
    ANSWER_MAX_NEW_TOKENS,
    FINAL_NUM_DOCS,
    PENALTY_TARGET,
    STOP_NO,
    STOP_YES,
    SUBANSWER_NUM_DOCS,
    SUBQUERY_MAX_NEW_TOKENS,
    final_answer_messages,
    parse_subquery,
    penalty_messages,
    stop_messages,
    subanswer_messages,
    subquery_messages,
)
from corag.types import Example, Passage, Step, Usage


@dataclass
class GenerationLimits:
    """New-token caps and stop strings of the three CoRAG calls (defaults: the release's 64/128/128,
    no stop strings), and whether sub-queries and sub-answers are taken exactly as the release takes them.

    The official agent cleans a sub-query (strip, quotes, `Intermediate query N: ` label) and searches
    all of it, and keeps a sub-answer as generated (microsoft/LMOps corag/src/agent/corag_agent.py,
    `_normalize_subquery` and `_get_subanswer_and_doc_ids`). By default the project searches only a
    sub-query's first line and strips sub-answers: the released checkpoints write one line, so this
    changes nothing for them, while a chat model that rambles on no longer sends paragraphs to the
    retriever. `as_released` turns both off, so the calls equal the official agent's.
    """

    _argument_group_name = "generation limits (corag.chain)"

    subquery_max_new_tokens: int = field(
        default=SUBQUERY_MAX_NEW_TOKENS, metadata={"help": "new tokens of a sub-query"}
    )
    subanswer_max_new_tokens: int = field(
        default=ANSWER_MAX_NEW_TOKENS, metadata={"help": "new tokens of a sub-answer"}
    )
    final_max_new_tokens: int = field(
        default=ANSWER_MAX_NEW_TOKENS, metadata={"help": "new tokens of the final answer"}
    )
    subquery_stop: list[str] = field(default_factory=list, metadata={"help": "stop strings of sub-queries"})
    subanswer_stop: list[str] = field(default_factory=list, metadata={"help": "stop strings of sub-answers"})
    final_stop: list[str] = field(default_factory=list, metadata={"help": "stop strings of final answers"})
    as_released: bool = field(
        default=False,
        metadata={"help": "take sub-queries and sub-answers as the official agent does: search the whole "
        "cleaned sub-query (not its first line only), keep sub-answers unstripped"},
    )  # fmt: skip

    def check(self) -> None:
        for name in ("subquery_max_new_tokens", "subanswer_max_new_tokens", "final_max_new_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"must be 1 or more, got {getattr(self, name)}", field=name)


DEFAULT_LIMITS = GenerationLimits()


class CorpusLike(Protocol):
    """The part of a corpus the chain needs: passages by id, in the order asked."""

    def get_many(self, ids: Sequence[str]) -> list[Passage]: ...


def call_seed(question_id: str, chain: int | str, step: int, attempt: int) -> int:
    """A sampling seed fixed by where the call sits in a question's search, never by batching."""
    key = f"{question_id}|{chain}|{step}|{attempt}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % 2**31


def fit_context(lm: LM, messages: list[Message], room: int) -> list[Message]:
    """Keep a prompt plus `room` more tokens inside the model's context.

    Prompts already follow the released prompts' limits (4096 / 3072 tokens); a model with a shorter context
    gets the last message middle-truncated further, by the same rule. Raises InputError when even
    that cannot fit (a context too small for the template and the new tokens).
    """
    limit = lm.max_context - room
    total = lm.count_prompt_tokens(messages)
    if total <= limit:
        return messages
    content = messages[-1]["content"]
    overhead = total - lm.count_tokens(content)
    for margin in (0, 4, 16, 64):  # re-tokenising a cut text can shift a boundary by a token or two
        allowed = limit - overhead - margin
        if allowed <= 0:
            break
        cut = [*messages[:-1], {**messages[-1], "content": lm.truncate_tokens(content, allowed, middle=True)}]
        if lm.count_prompt_tokens(cut) <= limit:
            return cut
    raise InputError(
        f"a prompt of {total} tokens cannot be cut to fit the model's context of {lm.max_context} tokens "
        f"with {room} tokens left for the answer",
        field="max_context",
    )


def _generation(lm: LM, messages: list[Message], max_new_tokens: int, **kw: Any) -> GenerationRequest:
    messages = fit_context(lm, messages, max_new_tokens)
    return GenerationRequest(tuple(messages), max_new_tokens=max_new_tokens, **kw)


def scoring_request(lm: LM, messages: list[Message], target: str, temperature: float = 1.0) -> ScoreRequest:
    """A score request for `target` after `messages`, the prompt cut to fit the context with it."""
    room = lm.count_score_tokens(ScoreRequest(tuple(messages), target)) - lm.count_prompt_tokens(messages)
    return ScoreRequest(tuple(fit_context(lm, messages, max(room, 0))), target, temperature)


async def next_subquery(
    ctx: Context,
    query: str,
    steps: Sequence[Step],
    task_desc: str,
    temperature: float = 0.0,
    seed: int | None = None,
    limits: GenerationLimits = DEFAULT_LIMITS,
) -> str:
    """Call A: the next sub-query, cleaned with parse_subquery."""
    texts = await subquery_candidates(
        ctx, query, steps, task_desc, n=1, temperature=temperature, seed=seed, limits=limits
    )
    return texts[0]


async def subquery_candidates(
    ctx: Context,
    query: str,
    steps: Sequence[Step],
    task_desc: str,
    n: int,
    temperature: float,
    seed: int | None = None,
    limits: GenerationLimits = DEFAULT_LIMITS,
) -> list[str]:
    """Call A sampled `n` times in one request (tree-search expansion), each cleaned (and cut to its
    first line unless `limits.as_released`), so a rambling output never reaches the retriever."""
    messages = subquery_messages(query, steps, task_desc, tok=ctx.lm)
    request = _generation(
        ctx.lm,
        messages,
        limits.subquery_max_new_tokens,
        temperature=temperature,
        n=n,
        seed=seed,
        stop=tuple(limits.subquery_stop),
    )
    completion = await ctx.generate(request)
    return [parse_subquery(text, first_line=not limits.as_released) for text in completion.texts]


async def subanswer(
    ctx: Context,
    subquery: str,
    corpus: CorpusLike,
    k: int = SUBANSWER_NUM_DOCS,
    limits: GenerationLimits = DEFAULT_LIMITS,
    temperature: float = 0.0,
    seed: int | None = None,
) -> Step:
    """Search the sub-query, then call B (greedy unless given a temperature) over its top-k documents:
    one finished Step."""
    hits = await ctx.search(subquery, k)
    doc_ids = tuple(hit.doc_id for hit in hits)
    messages = subanswer_messages(subquery, corpus.get_many(doc_ids), tok=ctx.lm)
    request = _generation(
        ctx.lm,
        messages,
        limits.subanswer_max_new_tokens,
        temperature=temperature,
        seed=seed,
        stop=tuple(limits.subanswer_stop),
    )
    completion = await ctx.generate(request)
    text = completion.texts[0]
    return Step(subquery, text if limits.as_released else text.strip(), doc_ids)


def final_request(
    lm: LM,
    query: str,
    steps: Sequence[Step],
    task_desc: str,
    passages: Sequence[Passage],
    limits: GenerationLimits = DEFAULT_LIMITS,
    temperature: float = 0.0,
    seed: int | None = None,
) -> GenerationRequest:
    """The request of call C (greedy unless given a temperature, 128 new tokens by default)."""
    messages = final_answer_messages(query, steps, task_desc, passages, tok=lm)
    return _generation(
        lm,
        messages,
        limits.final_max_new_tokens,
        temperature=temperature,
        seed=seed,
        stop=tuple(limits.final_stop),
    )


def final_cost(
    lm: LM,
    query: str,
    steps: Sequence[Step],
    task_desc: str,
    passages: Sequence[Passage],
    limits: GenerationLimits = DEFAULT_LIMITS,
) -> int:
    """Worst-case tokens of call C for these steps: its actual prompt plus its new-token cap."""
    request = final_request(lm, query, steps, task_desc, passages, limits)
    return lm.count_prompt_tokens(request.messages) + request.max_new_tokens


async def final_answer(
    ctx: Context,
    query: str,
    steps: Sequence[Step],
    task_desc: str,
    passages: Sequence[Passage],
    limits: GenerationLimits = DEFAULT_LIMITS,
    temperature: float = 0.0,
    seed: int | None = None,
) -> str:
    """Call C: the final answer from the chain and the original query's documents.

    Marked final, so it may use the budget's reserve.
    """
    request = final_request(ctx.lm, query, steps, task_desc, passages, limits, temperature, seed)
    completion = await ctx.generate(request, final=True)
    return completion.texts[0].strip()


async def penalty(ctx: Context, query: str, steps: Sequence[Step]) -> float:
    """Mean log-probability of `No relevant information found` given the chain as documents.

    Lower is better: the chain makes "no information" less likely.
    """
    request = scoring_request(ctx.lm, penalty_messages(query, steps, tok=ctx.lm), PENALTY_TARGET)
    return (await ctx.score(request)).mean


# The stop decision is read from the model's own distribution (temperature 1) wherever it is taken:
# evaluation takes the likelier turn, a rollout draws Yes with its share. One rule, so the decision
# training samples is the one evaluation takes, and vLLM's prompt log-probabilities (the model's own) give it.
STOP_TEMPERATURE = 1.0


async def should_stop(ctx: Context, query: str, steps: Sequence[Step], task_desc: str, bias: float) -> bool:
    """Learned stop: True when log P(Yes) + bias > log P(No) for the stop prompt.

    Both answers are scored as whole assistant turns (content and end-of-turn token) in one call, its
    prompt metered once (`stop_scores`). Picking the likelier of the two is the same as decoding with the
    output constrained to the two answers and a logit bias `bias` added to "Yes"; larger bias stops earlier.
    """
    _, yes, no = await stop_scores(ctx, query, steps, task_desc)
    return sum(yes.logprobs) + bias > sum(no.logprobs)


async def stop_scores(
    ctx: Context, query: str, steps: Sequence[Step], task_desc: str
) -> tuple[tuple[Message, ...], Score, Score]:
    """The stop prompt (as scored) and its Yes and No turns' scores at STOP_TEMPERATURE: one call, as
    the paper's decision is one call, metered at the prompt once plus the two turns."""
    messages = stop_messages(query, steps, task_desc, tok=ctx.lm)
    room = max(ctx.lm.count_score_tokens(ScoreRequest(tuple(messages), t)) for t in (STOP_YES, STOP_NO))
    fitted = tuple(fit_context(ctx.lm, messages, max(room - ctx.lm.count_prompt_tokens(messages), 0)))
    choices = await ctx.score_choices(ChoiceRequest(fitted, (STOP_YES, STOP_NO), STOP_TEMPERATURE))
    yes, no = choices.scores
    return fitted, yes, no


async def stop_choice(
    ctx: Context, query: str, steps: Sequence[Step], task_desc: str, sample: bool, seed: int | None
) -> bool:
    """The learned stop as the policy's decision: with `sample` (a rollout), Yes drawn with its share of the
    two turns' probabilities; without, the likelier turn (`should_stop` at bias 0, as greedy decoding
    takes it). Both read the same one-call scores at STOP_TEMPERATURE, so what training samples is what
    evaluation decides.

    With `ctx.trace` kept, a drawn decision enters it as a sampled generation: its prompt's and the chosen
    turn's ids, as scored, their log-probabilities, and the one call's tokens.
    """
    if not sample:
        return await should_stop(ctx, query, steps, task_desc, 0.0)
    prompt, yes, no = await stop_scores(ctx, query, steps, task_desc)
    p_yes = 1.0 / (1.0 + math.exp(min(sum(no.logprobs) - sum(yes.logprobs), 700.0)))  # 700: exp's range
    stop = random.Random(seed).random() < p_yes
    if ctx.trace is not None:
        chosen, text = (yes, STOP_YES) if stop else (no, STOP_NO)
        if not chosen.token_ids:
            raise InputError(
                "this backend does not return the scored ids a trained stop decision needs", field="lm"
            )
        sample_ids = Sample(chosen.prompt_ids, chosen.token_ids, chosen.logprobs)
        request = GenerationRequest(
            prompt, len(chosen.token_ids), temperature=STOP_TEMPERATURE, seed=seed, logprobs=True
        )
        usage = Usage(len(chosen.prompt_ids) + len(yes.logprobs) + len(no.logprobs), 0, 1)  # the one call
        ctx.trace.append((request, Completion((text,), usage, (sample_ids,))))
    return stop


@dataclass(frozen=True)
class Question:
    """What every step of one question needs: the question, its task description, the corpus the
    steps read from, the top documents for the original query (the final answer's), and where those
    came from ("dataset": the example's precomputed `context_doc_ids`; "retrieved": a search here)."""

    id: str
    query: str
    task_desc: str
    corpus: CorpusLike
    passages: tuple[Passage, ...]
    docs_source: str = "retrieved"
    limits: GenerationLimits = field(default_factory=GenerationLimits)

    @property
    def doc_ids(self) -> tuple[str, ...]:
        return tuple(p.id for p in self.passages)


# Where the final answer's documents come from: the dataset's own `context_doc_ids` when an example
# has them (the official inference answers from `context_doc_ids[:20]`), or a search of the query.
FINAL_DOCS = ("auto", "dataset", "retrieve")


def check_final_docs(final_docs: str) -> None:
    if final_docs not in FINAL_DOCS:
        raise InputError(f"unknown final_docs {final_docs!r}; choose one of {FINAL_DOCS}", field="final_docs")


def dataset_doc_ids(example: Example) -> list[str]:
    """The example's precomputed final-answer document ids (`context_doc_ids`), best first."""
    return [str(d) for d in example.meta.get("context_doc_ids") or ()]


def final_passages(corpus: CorpusLike, example: Example, docs: int) -> tuple[Passage, ...]:
    """The first `docs` of the example's `context_doc_ids`, or an error naming the question when the
    corpus lacks one (they are rows of the corpus they were retrieved from, corag/kilt-corpus)."""
    ids = dataset_doc_ids(example)[:docs]
    try:
        return tuple(corpus.get_many(ids))
    except InputError as error:
        raise InputError(
            f"document {error.record!r} of context_doc_ids is not in the corpus {error.file}: those ids are "
            "rows of the corpus they were retrieved from (corag/kilt-corpus); use --final-docs retrieve to "
            "search this one",
            record=example.id,
            field="context_doc_ids",
        ) from None


def check_dataset_docs(examples: Sequence[Example], corpus: CorpusLike, final_docs: str = "auto") -> int:
    """Before any model loads: every `context_doc_ids` the final answers will read is in the corpus
    (and with "dataset", every question has them). Returns how many questions read them."""
    check_final_docs(final_docs)
    if final_docs == "retrieve":
        return 0
    count = 0
    for example in examples:
        if not dataset_doc_ids(example):
            if final_docs == "dataset":
                raise InputError(
                    "the question has no context_doc_ids", record=example.id, field="context_doc_ids"
                )
            continue
        final_passages(corpus, example, FINAL_NUM_DOCS)
        count += 1
    return count


async def open_question(
    ctx: Context,
    example: Example,
    corpus: CorpusLike,
    task_desc: str | None = None,
    docs: int = FINAL_NUM_DOCS,
    final_docs: str = "auto",
    limits: GenerationLimits | None = None,
) -> Question:
    """The original query's top documents (20, as the paper; 0 for none at all): with `final_docs`
    "auto", the example's own `context_doc_ids` when it has them, else a search; "dataset" or
    "retrieve" force one. Then reserve budget for the final answer.

    When the budget cannot hold even the final answer without steps, no model call is started."""
    if docs < 0:
        raise InputError(f"the number of documents must be 0 or more, got {docs}", field="docs")
    check_final_docs(final_docs)
    given = final_docs == "dataset" or (final_docs == "auto" and bool(dataset_doc_ids(example)))
    if given and not dataset_doc_ids(example):
        raise InputError("the question has no context_doc_ids", record=example.id, field="context_doc_ids")
    if given:
        passages = final_passages(corpus, example, docs)
    else:
        hits = await ctx.search(example.query, docs) if docs else []
        passages = tuple(corpus.get_many([hit.doc_id for hit in hits]))
    task_desc = task_desc or tasks.task_description(example.task, example.meta)
    source = "dataset" if given else "retrieved"
    question = Question(
        example.id, example.query, task_desc, corpus, passages, source, limits or DEFAULT_LIMITS
    )
    if not keep_room_for_final(ctx, question, ()) and ctx.meter.budget is not None:
        ctx.meter.reserve = ctx.meter.budget  # not even the bare final answer fits: start nothing
    return question


def keep_room_for_final(ctx: Context, question: Question, steps: Sequence[Step]) -> bool:
    """Whether the final answer over `steps` still fits the budget; if so, reserve room for it.

    The reserve only grows, so it always covers the final answer of any chain accepted so far:
    no later call may eat into it. A step whose final answer would not fit is not taken.
    """
    meter = ctx.meter
    if meter.budget is None:
        return True
    cost = final_cost(ctx.lm, question.query, steps, question.task_desc, question.passages, question.limits)
    if not meter.fits(cost) or cost > meter.budget:
        return False
    meter.reserve = max(meter.reserve, cost)
    return True


async def safe_penalty(ctx: Context, query: str, steps: Sequence[Step]) -> float | None:
    """The penalty, or None when the budget leaves no room for it."""
    try:
        return await penalty(ctx, query, steps)
    except BudgetExceeded:
        return None


@dataclass
class DecodeResult:
    """One question's outcome: the chain, the prediction and what it cost."""

    query_id: str
    query: str
    answers: tuple[str, ...]
    strategy: str
    steps: tuple[Step, ...]
    prediction: str
    context_doc_ids: tuple[str, ...]
    usage: Usage
    extras: dict[str, Any] = field(default_factory=dict)
    context_doc_source: str = "retrieved"

    @property
    def calls(self) -> int:
        return self.usage.calls

    def to_record(self) -> dict[str, Any]:
        """The official CoRAG prediction fields, then ours (where the final answer's documents came
        from, steps with doc ids, usage, extras)."""
        return {
            "query": self.query,
            "answers": list(self.answers),
            "query_id": self.query_id,
            "context_doc_ids": list(self.context_doc_ids),
            "context_doc_source": self.context_doc_source,
            "subqueries": [s.subquery for s in self.steps],
            "subanswers": [s.subanswer for s in self.steps],
            "predictions": self.prediction,
            "strategy": self.strategy,
            "steps": [
                {"subquery": s.subquery, "subanswer": s.subanswer, "doc_ids": list(s.doc_ids)}
                for s in self.steps
            ],
            "usage": {
                "prompt_tokens": self.usage.prompt_tokens,
                "completion_tokens": self.usage.completion_tokens,
                "total_tokens": self.usage.total,
            },
            "model_calls": self.usage.calls,
            **self.extras,
        }


async def finish(
    ctx: Context,
    question: Question,
    example: Example,
    strategy: str,
    steps: Sequence[Step],
    extras: dict[str, Any] | None = None,
    temperature: float = 0.0,
    seed: int | None = None,
) -> DecodeResult:
    """Write the final answer (top-20 documents for the original query; greedy unless given a
    temperature) and the result record.

    When even the final answer cannot fit the budget (a budget below its prompt), the prediction is
    empty and `final_skipped` is recorded.
    """
    extras = dict(extras or {})
    try:
        prediction = await final_answer(
            ctx,
            question.query,
            steps,
            question.task_desc,
            question.passages,
            question.limits,
            temperature,
            seed,
        )
    except BudgetExceeded:
        prediction, extras["final_skipped"] = "", True
    return DecodeResult(
        query_id=example.id,
        query=example.query,
        answers=example.answers,
        strategy=strategy,
        steps=tuple(steps),
        prediction=prediction,
        context_doc_ids=question.doc_ids,
        usage=ctx.meter.usage,
        extras=extras,
        context_doc_source=question.docs_source,
    )
