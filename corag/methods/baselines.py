"""IRCoT's two baselines: one-step retrieval with the reader, and the reader without retrieval."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from corag.budget import BudgetExceeded
from corag.executor import Context
from corag.methods.demos import Demonstration
from corag.methods.ircot import add_paragraphs, read, reader_request, remove_wh_words, result_record, retrieve
from corag.types import Example, Passage

if TYPE_CHECKING:
    from corag.data.corpus import Corpus


async def one_step(
    ctx: Context,
    example: Example,
    *,
    corpus: Corpus,
    demonstrations: Sequence[Demonstration] = (),
    k: int = 10,
    reader: str = "direct",
    reader_max_new_tokens: int | None = None,
    max_prompt_tokens: int | None = None,
) -> dict[str, Any]:
    """Retrieve `k` paragraphs once with the question (IRCoT's grid: 5..15) and read them."""
    query = remove_wh_words(example.query)
    found = await retrieve(ctx, corpus, query, k)
    held: list[Passage] = []
    add_paragraphs(held, found, max_paragraphs=k)
    reading = (demonstrations, reader, reader_max_new_tokens, max_prompt_tokens)
    return await answer(ctx, example, "one_step", held, reading, [p.id for p in found], queries=[query])


async def no_retrieval(
    ctx: Context,
    example: Example,
    *,
    corpus: Corpus | None = None,
    demonstrations: Sequence[Demonstration] = (),
    reader: str = "direct",
    reader_max_new_tokens: int | None = None,
    max_prompt_tokens: int | None = None,
) -> dict[str, Any]:
    """The reader with no paragraphs: what the model answers from its own knowledge."""
    reading = (demonstrations, reader, reader_max_new_tokens, max_prompt_tokens)
    return await answer(ctx, example, "no_retrieval", [], reading, [])


async def answer(
    ctx: Context,
    example: Example,
    method: str,
    held: list[Passage],
    reading: tuple[Sequence[Demonstration], str, int | None, int | None],
    found_ids: list[str],
    **extra: Any,
) -> dict[str, Any]:
    """The reader's answer from the paragraphs `held` (an empty answer once the budget is spent), as
    the method's prediction record."""
    demonstrations, reader, reader_max_new_tokens, max_prompt_tokens = reading
    calls: list[dict[str, Any]] = []
    try:
        request = reader_request(
            ctx,
            example.query,
            held,
            demonstrations,
            reader=reader,
            max_new_tokens=reader_max_new_tokens,
            max_prompt_tokens=max_prompt_tokens,
        )
        prediction, text, source = await read(ctx, calls, request, reader)
    except BudgetExceeded:
        prediction, text, source = "", "", "none"
    return result_record(
        ctx,
        example,
        method,
        prediction,
        found_ids,
        [p.id for p in held],
        calls,
        **extra,
        reader=reader,
        reader_output=text,
        answer_source=source,
        parse_failures=int(source != "format" and bool(calls)),
    )
