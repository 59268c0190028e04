"""IRCoT: interleave chain-of-thought sentences with retrieval, then answer with a separate reader.

Per question: retrieve K paragraphs with the question; repeatedly ask for the next CoT sentence given
the demonstrations, all paragraphs so far, the question and the CoT so far, and retrieve K more with the
last sentence that states a fact; stop at "answer is: X", an empty sentence or `max_sentences`. A reader
then answers from the collected paragraphs alone (it never sees the CoT). The reader is also the one-step
and no-retrieval baselines (corag.methods.baselines).

Prompts are chat turns (corag.prompts): demonstrations as user/assistant pairs, the question last, the
CoT so far as the start of the assistant's reply. Replies are read leniently: a leading `A:` (the
completion-style marker) is dropped, and each record says where its answer came from (`answer_source`)
and how many replies did not follow the format (`parse_failures`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from corag.budget import BudgetExceeded
from corag.executor import Context
from corag.lm.base import Completion, GenerationRequest, Message
from corag.methods.demos import Demonstration
from corag.prompts import (
    IRCOT_COT_INSTRUCTION,
    IRCOT_COT_READER_INSTRUCTION,
    IRCOT_DIRECT_READER_INSTRUCTION,
    ircot_messages,
    ircot_paragraph,
    ircot_question,
)
from corag.types import Example, Passage

if TYPE_CHECKING:
    from corag.data.corpus import Corpus

MAX_PARAGRAPH_WORDS = 600  # longer retrieved paragraphs are not held
NEAR_DUPLICATE_JACCARD = 0.9
READERS = ("direct", "cot")

_WH_WORDS = re.compile(r"\b(?:who|whom|whose|what|when|where|which|why|how)\b", re.IGNORECASE)
_REASONING_START = re.compile(r"^(?:so|thus|therefore|hence|that is)\b", re.IGNORECASE)
_ARITHMETIC = re.compile(r"\d[\d,.]*\s*[-+*/x×]\s*\d[\d,.]*\s*=\s*\d")
_ANSWER = re.compile(r"answer is:? (.*)")
_FIRST_SENTENCE = re.compile(r"^(.+?[.!?])(?=\s|$)", re.DOTALL)
_SENTENCES = re.compile(r"[^.!?]+(?:[.!?]+|$)")
_LEADING_MARKER = re.compile(r"^\s*(?:A|Answer)\s*:\s*", re.IGNORECASE)


def remove_wh_words(text: str) -> str:
    """The text without question words, whitespace collapsed (a better keyword query)."""
    return " ".join(_WH_WORDS.sub(" ", text).split())


def is_reasoning_sentence(sentence: str) -> bool:
    """Pure reasoning (So/Thus/Therefore/Hence/That is ..., or arithmetic) states no new fact to search."""
    sentence = sentence.strip()
    return bool(_REASONING_START.match(sentence) or _ARITHMETIC.search(sentence))


def strip_marker(text: str) -> str:
    """The text without a leading `A:` (or `Answer:`), the completion-style answer marker."""
    return _LEADING_MARKER.sub("", text.strip(), count=1).strip()


def first_sentence(text: str) -> str:
    """The first sentence of a generation (up to the first . ! or ? followed by a space or the end),
    after a leading `A:`."""
    text = " ".join(strip_marker(text).split())
    match = _FIRST_SENTENCE.match(text)
    return match.group(1) if match else text


def last_sentence(text: str) -> str:
    """The last non-empty sentence of a text, without its final full stop."""
    sentences = [s.strip() for s in _SENTENCES.findall(" ".join(text.split())) if s.strip(" .!?")]
    return sentences[-1].rstrip(".").strip() if sentences else ""


def extract_answer(text: str) -> str | None:
    """The answer after `answer is:?` (minus one trailing full stop), or None without that phrase."""
    match = _ANSWER.search(text)
    if match is None:
        return None
    answer = match.group(1).strip()
    return (answer[:-1] if answer.endswith(".") else answer).strip()


def retrieval_query(question: str, sentences: Sequence[str]) -> str:
    """The last generated sentence that is not pure reasoning (the question before there is one),
    without question words."""
    for sentence in reversed(sentences):
        if sentence.strip() and not is_reasoning_sentence(sentence):
            return remove_wh_words(sentence)
    return remove_wh_words(question)


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def is_near_duplicate(a: Passage, b: Passage, threshold: float = NEAR_DUPLICATE_JACCARD) -> bool:
    """Same id; the same text up to case, punctuation and spacing; or word sets whose Jaccard
    similarity is at least `threshold` (copies of one paragraph under another id or title)."""
    if a.id == b.id:
        return True
    wa, wb = _words(a.contents), _words(b.contents)
    if wa == wb:
        return _words(a.title) == _words(b.title) or bool(wa)
    sa, sb = set(wa), set(wb)
    return bool(sa and sb) and len(sa & sb) / len(sa | sb) >= threshold


def add_paragraphs(
    held: list[Passage],
    new: Sequence[Passage],
    max_paragraphs: int = 15,
    max_words: int = MAX_PARAGRAPH_WORDS,
) -> list[Passage]:
    """Append to `held` the new paragraphs that are not near-duplicates of held ones nor longer than
    `max_words`, never holding more than `max_paragraphs`; returns those added."""
    added = []
    for passage in new:
        if len(held) >= max_paragraphs:
            break
        if len(passage.contents.split()) > max_words:
            continue
        if any(is_near_duplicate(passage, other) for other in held):
            continue
        held.append(passage)
        added.append(passage)
    return added


def render_paragraphs(passages: Sequence[Passage]) -> list[str]:
    return [ircot_paragraph(p.title, p.contents) for p in passages]


def fit_prompt(
    ctx: Context,
    instruction: str,
    demos: Sequence[tuple[str, str]],
    question: str,
    limit: int,
    reply_start: str = "",
) -> tuple[list[Message], int]:
    """The prompt with as many demonstrations as fit in `limit` tokens, dropping them from the front;
    returns the messages and the number of demonstrations kept. Without any demonstration, a question
    turn that is still too long is middle-truncated (its first paragraphs and its `Q:` end are kept)."""
    for start in range(len(demos) + 1):
        messages = ircot_messages(instruction, demos[start:], question, reply_start)
        tokens = ctx.lm.count_prompt_tokens(messages)
        if tokens <= limit:
            return messages, len(demos) - start
    room = max(1, ctx.lm.count_tokens(question) - (tokens - limit))
    while True:  # token counts of cut text can shift by a token or two at the seams
        cut = ctx.lm.truncate_tokens(question, room, middle=True)
        messages = ircot_messages(instruction, [], cut, reply_start)
        if ctx.lm.count_prompt_tokens(messages) <= limit or room == 1:
            return messages, 0
        room = max(1, room - 8)


def prompt_limit(ctx: Context, max_new_tokens: int, max_prompt_tokens: int | None) -> int:
    """Prompt tokens allowed: the context minus the generation, or `max_prompt_tokens` if smaller."""
    limit = ctx.lm.max_context - max_new_tokens
    return limit if max_prompt_tokens is None else min(limit, max_prompt_tokens)


async def metered_generate(
    ctx: Context, calls: list[dict[str, Any]], purpose: str, request: GenerationRequest, final: bool = False
) -> Completion:
    """ctx.generate, with the call's usage appended to `calls` (so a record shows where tokens went)."""
    completion = await ctx.generate(request, final=final)
    usage = completion.usage
    calls.append(
        {
            "purpose": purpose,
            "kind": "generate",
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
        }
    )
    return completion


async def retrieve(ctx: Context, corpus: Corpus, query: str, k: int) -> list[Passage]:
    """Top-k passages for a query, in rank order."""
    hits = await ctx.search(query, k)
    return list(corpus.get_many([h.doc_id for h in hits])) if hits else []


def reader_request(
    ctx: Context,
    question: str,
    passages: Sequence[Passage],
    demonstrations: Sequence[Demonstration] = (),
    *,
    reader: str = "direct",
    max_new_tokens: int | None = None,
    max_prompt_tokens: int | None = None,
) -> GenerationRequest:
    """The reader's request: demonstrations as turns, then the paragraphs and `Q: {question}` as the
    user's turn; the reply is the answer (direct) or reasoning ending in "So the answer is:" (cot).

    Without paragraphs (no retrieval) demonstrations are shown without theirs too. The direct reader
    has no stop string: a reply that opens with `A:` and a line break still holds its answer.
    """
    if reader not in READERS:
        raise ValueError(f"unknown reader {reader!r}; choose one of {READERS}")
    with_paragraphs = bool(passages)
    if reader == "direct":
        instruction, stop, new_tokens = IRCOT_DIRECT_READER_INSTRUCTION, (), max_new_tokens or 32
        demos = [d.turns(d.answer, with_paragraphs=with_paragraphs) for d in demonstrations]
    else:
        instruction, stop, new_tokens = IRCOT_COT_READER_INSTRUCTION, ("\n\n",), max_new_tokens or 256
        demos = [d.turns(d.cot, with_paragraphs=with_paragraphs) for d in demonstrations]
    turn = ircot_question(render_paragraphs(passages), question)
    limit = prompt_limit(ctx, new_tokens, max_prompt_tokens)
    messages, _ = fit_prompt(ctx, instruction, demos, turn, limit)
    return GenerationRequest(tuple(messages), max_new_tokens=new_tokens, stop=stop)


def reserve_for_reader(ctx: Context, request: GenerationRequest) -> None:
    """Under a budget, hold back what the reader's call may cost so the CoT cannot spend it."""
    if ctx.meter.budget is not None:
        cost = ctx.lm.count_prompt_tokens(request.messages) + request.max_new_tokens
        ctx.meter.reserve = max(ctx.meter.reserve, cost)


def direct_answer(text: str) -> str:
    """A direct reader's answer: the first line with words after dropping a leading `A:` (an echoed
    `Q:` line is skipped)."""
    for line in text.splitlines():
        line = strip_marker(line)
        if line.strip(" .") and not line.startswith("Q:"):
            return line
    return ""


def reader_answer(text: str, reader: str) -> tuple[str, str]:
    """(answer, source) from a reader's reply. Direct: its first answer line ("format"). CoT: the
    answer after "answer is:" ("format"), else its last sentence ("text"). An empty answer: "none"."""
    if reader == "direct":
        answer, source = direct_answer(text), "format"
    else:
        extracted = extract_answer(text)
        answer, source = (extracted, "format") if extracted else (last_sentence(strip_marker(text)), "text")
    return (answer, source) if answer else ("", "none")


async def read(
    ctx: Context, calls: list[dict[str, Any]], request: GenerationRequest, reader: str
) -> tuple[str, str, str]:
    """Run the reader's request (a final call: it may use the reserve). Returns (answer, generated
    text, answer source) as `reader_answer` reads them."""
    completion = await metered_generate(ctx, calls, f"reader:{reader}", request, final=True)
    text = completion.texts[0].strip()
    answer, source = reader_answer(text, reader)
    return answer, text, source


def result_record(
    ctx: Context,
    example: Example,
    method: str,
    prediction: str,
    doc_ids: Sequence[str],
    context_doc_ids: Sequence[str],
    calls: list[dict[str, Any]],
    **extra: Any,
) -> dict[str, Any]:
    """The fields every method's record shares: those of CoRAG's prediction records (query_id,
    predictions, context_doc_ids, usage, model_calls), then `prediction`, `doc_ids` (everything
    retrieved, in order), `tokens` and `calls` (each model call's usage, which sum to `tokens`).
    Methods add `answer_source` ("format", a fallback such as "text", or "none") and
    `parse_failures` (replies that did not follow the method's format), which evaluation counts."""
    usage = ctx.meter.usage
    return {
        "query": example.query,
        "answers": list(example.answers),
        "query_id": example.id,
        "context_doc_ids": list(context_doc_ids),
        "predictions": prediction,
        "strategy": method,
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total,
        },
        "model_calls": usage.calls,
        "prediction": prediction,
        "doc_ids": list(doc_ids),
        "tokens": usage.total,
        "calls": calls,
        **extra,
    }


async def ircot(
    ctx: Context,
    example: Example,
    *,
    corpus: Corpus,
    demonstrations: Sequence[Demonstration] = (),
    k: int = 4,
    max_sentences: int = 8,
    max_paragraphs: int = 15,
    reader: str = "direct",
    sentence_max_new_tokens: int = 64,
    reader_max_new_tokens: int | None = None,
    max_prompt_tokens: int | None = None,
) -> dict[str, Any]:
    """IRCoT for one question; returns its result record (prediction, cot, paragraphs, tokens, calls).

    Under `ctx.meter`'s budget, if it has one, room for the reader over the paragraphs held is
    reserved before each sentence; the CoT stops when a sentence would not fit beside it.
    """
    calls: list[dict[str, Any]] = []
    doc_ids: list[str] = []  # every retrieved id, in order (also those not held)
    held: list[Passage] = []
    sentences: list[str] = []
    stop_reason = "max_sentences"
    cot_answer = None
    demos = [d.turns(d.cot) for d in demonstrations]
    limit = prompt_limit(ctx, sentence_max_new_tokens, max_prompt_tokens)
    queries = [remove_wh_words(example.query)]
    found = await retrieve(ctx, corpus, queries[0], k)
    doc_ids += [p.id for p in found]
    add_paragraphs(held, found, max_paragraphs)
    demos_kept = []

    def read_request(passages: Sequence[Passage]) -> GenerationRequest:
        return reader_request(
            ctx,
            example.query,
            passages,
            demonstrations,
            reader=reader,
            max_new_tokens=reader_max_new_tokens,
            max_prompt_tokens=max_prompt_tokens,
        )

    for _ in range(max_sentences):
        reserve_for_reader(ctx, read_request(held))
        turn = ircot_question(render_paragraphs(held), example.query)
        messages, kept = fit_prompt(ctx, IRCOT_COT_INSTRUCTION, demos, turn, limit, " ".join(sentences))
        demos_kept.append(kept)
        request = GenerationRequest(tuple(messages), max_new_tokens=sentence_max_new_tokens, stop=("\n",))
        try:
            completion = await metered_generate(ctx, calls, "cot", request)
        except BudgetExceeded:
            stop_reason = "budget"
            break
        sentence = first_sentence(completion.texts[0])
        if not sentence:
            stop_reason = "empty"
            break
        sentences.append(sentence)
        queries.append(retrieval_query(example.query, sentences))
        found = await retrieve(ctx, corpus, queries[-1], k)
        doc_ids += [p.id for p in found]
        add_paragraphs(held, found, max_paragraphs)
        cot_answer = extract_answer(sentence)
        if cot_answer is not None:
            stop_reason = "answer"
            break
    try:
        prediction, reader_text, source = await read(ctx, calls, read_request(held), reader)
    except BudgetExceeded:
        prediction, reader_text, source, stop_reason = "", "", "none", "budget"
    return result_record(
        ctx,
        example,
        "ircot",
        prediction,
        doc_ids,
        [p.id for p in held],
        calls,
        cot=" ".join(sentences),
        cot_sentences=sentences,
        cot_answer=cot_answer,
        queries=queries,
        reader=reader,
        reader_output=reader_text,
        demonstrations_kept=demos_kept,
        stop_reason=stop_reason,
        answer_source=source,
        parse_failures=int(source != "format" and bool(calls) and calls[-1]["purpose"].startswith("reader")),
    )
