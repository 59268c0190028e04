"""Every prompt of every method, in one place.

The three CoRAG calls (sub-query, sub-answer, final answer) reproduce byte for byte the strings the
released CoRAG checkpoints were trained on; change them and those checkpoints stop working. Each call is
one user message, rendered later with the model's own chat template. IRCoT's and SearChain's prompts
are chat turns (see their section below).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from corag import tasks
from corag.lm.base import Message
from corag.types import Passage, Step

SUBQUERY_MAX_NEW_TOKENS = 64
ANSWER_MAX_NEW_TOKENS = 128
MESSAGE_MAX_TOKENS = 4096  # calls A and B
FINAL_MESSAGE_MAX_TOKENS = 3072  # call C
FINAL_NUM_DOCS = 20
FINAL_DOC_MAX_TOKENS = int(3072 / FINAL_NUM_DOCS * 1.2)  # 184
SUBANSWER_NUM_DOCS = 5
NO_INFO = "No relevant information found"
PENALTY_TARGET = NO_INFO


class Truncator(Protocol):
    """The part of an LM the prompts need: token-level truncation with its tokenizer."""

    def truncate_tokens(self, text: str, max_tokens: int, *, middle: bool = False) -> str: ...


def task_description(task: str) -> str:
    """The task description string for a task name (every task of `corag.tasks`, KILT's included)."""
    return tasks.get_task(task).description


def format_past(steps: Sequence[Step]) -> str:
    """The history block of calls A and C, or `Nothing yet` before the first step."""
    lines = []
    for i, step in enumerate(steps, start=1):
        lines.append(f"Intermediate query {i}: {step.subquery}")
        lines.append(f"Intermediate answer {i}: {step.subanswer}")
    return "\n".join(lines).strip() or "Nothing yet"


def format_document(passage: Passage) -> str:
    """`title\\ncontents`, without repeating a title that the contents already start with."""
    contents = passage.contents
    if passage.title and contents.startswith(passage.title + "\n"):
        contents = contents[len(passage.title) + 1 :]
    return f"{passage.title}\n{contents}".strip()


def fit_message(text: str, max_tokens: int, tok: Truncator | None) -> str:
    """Middle-truncate a message whose text is at least 2 x max_tokens characters to max_tokens tokens."""
    if tok is None or len(text) < 2 * max_tokens:
        return text
    return tok.truncate_tokens(text, max_tokens, middle=True)


def _user(content: str) -> list[Message]:
    return [{"role": "user", "content": content}]


def subquery_messages(
    query: str, steps: Sequence[Step], task_desc: str, tok: Truncator | None = None
) -> list[Message]:
    """Call A: ask for the next sub-query given the steps so far."""
    content = f"""You are using a search engine to answer the main query by iteratively searching the web. Given the following intermediate queries and answers, generate a new simple follow-up question that can help answer the main query. You may rephrase or decompose the main query when previous answers are not helpful. Ask simple follow-up questions only as the search engine may not understand complex questions.

## Previous intermediate queries and answers
{format_past(steps)}

## Task description
{task_desc}

## Main query to answer
{query}

Respond with a simple follow-up question that will help answer the main query, do not explain yourself or output anything else."""
    return _user(fit_message(content, MESSAGE_MAX_TOKENS, tok))


def _subanswer_content(query: str, documents: str) -> str:
    return f"""Given the following documents, generate an appropriate answer for the query. DO NOT hallucinate any information, only use the provided documents to generate the answer. Respond "No relevant information found" if the documents do not contain useful information.

## Documents
{documents}

## Query
{query}

Respond with a concise answer only, do not explain yourself or output anything else."""


def subanswer_messages(
    subquery: str, passages: Sequence[Passage], tok: Truncator | None = None
) -> list[Message]:
    """Call B: answer a sub-query from its documents, given in rank order and shown best-last."""
    documents = "\n\n".join(format_document(p) for p in reversed(passages))
    return _user(fit_message(_subanswer_content(subquery, documents), MESSAGE_MAX_TOKENS, tok))


def final_answer_messages(
    query: str,
    steps: Sequence[Step],
    task_desc: str,
    passages: Sequence[Passage] = (),
    tok: Truncator | None = None,
) -> list[Message]:
    """Call C: the final answer from the chain and the question's documents (rank order in,
    each cut to 184 tokens, shown best-last as `Doc 0` .. `Doc n-1`)."""
    docs = list(reversed(passages[:FINAL_NUM_DOCS]))
    rendered = []
    for i, passage in enumerate(docs):
        text = format_document(passage)
        if tok is not None:
            text = tok.truncate_tokens(text, FINAL_DOC_MAX_TOKENS)
        rendered.append(f"Doc {i}: {text}")
    documents = "\n\n".join(rendered)
    content = f"""Given the following intermediate queries and answers, generate a final answer for the main query by combining relevant information. Note that intermediate answers are generated by an LLM and may not always be accurate.

## Documents
{documents}

## Intermediate queries and answers
{format_past(steps)}

## Task description
{task_desc}

## Main query
{query}

Respond with an appropriate answer only, do not explain yourself or output anything else."""
    return _user(fit_message(content, FINAL_MESSAGE_MAX_TOKENS, tok))


def penalty_messages(query: str, steps: Sequence[Step], tok: Truncator | None = None) -> list[Message]:
    """Best-of-N's chain penalty prompt: call B over the main query with the steps as documents.

    Score it with target PENALTY_TARGET; a lower mean log-probability means a more useful chain.
    """
    documents = "\n\n".join(f"Q: {s.subquery}\nA: {s.subanswer}" for s in steps)
    return _user(fit_message(_subanswer_content(query, documents), MESSAGE_MAX_TOKENS, tok))


STOP_YES, STOP_NO = "Yes", "No"


def stop_messages(
    query: str, steps: Sequence[Step], task_desc: str, tok: Truncator | None = None
) -> list[Message]:
    """Learned stop: does the chain so far hold enough to answer? Target `Yes` or `No`.

    The paper did not publish its prompt; this one is ours, in the style of calls A-C.
    """
    content = f"""Given the following intermediate queries and answers, judge whether they contain enough information to answer the main query.

## Intermediate queries and answers
{format_past(steps)}

## Task description
{task_desc}

## Main query
{query}

Respond with "Yes" if the main query can be answered now, otherwise "No". Do not explain yourself or output anything else."""
    return _user(fit_message(content, MESSAGE_MAX_TOKENS, tok))


_LEADING_LABEL = re.compile(r"^Intermediate query \d+:\s*")
_RELEASE_LABEL = re.compile(r"^Intermediate query \d+: ")


def parse_subquery(text: str, first_line: bool = False) -> str:
    """Clean a generated sub-query as the release does: strip, drop surrounding quotes, drop a leading
    `Intermediate query N: ` label. With `first_line` (corag.chain.GenerationLimits' default), keep only
    its first non-empty line first, and strip what the quotes and the label leave."""
    text = text.strip()
    if not first_line:
        if text.startswith('"') and text.endswith('"'):
            text = text[1:-1]
        return _RELEASE_LABEL.sub("", text)
    text = text.split("\n", 1)[0].strip()
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        text = text[1:-1].strip()
    return _LEADING_LABEL.sub("", text).strip()


# ---------------------------------------------------------------------------------------------------
# IRCoT and SearChain (corag/methods). Neither paper's checkpoints depend on exact strings, so these
# templates are the project's own wording. Both methods were designed for completion models; here they
# are laid out as chat turns, keeping the official formats inside the turns. IRCoT: each demonstration is
# a user turn (its paragraphs and `Q: {question}`) and an assistant turn (its answer or CoT: the reply
# plays the part of the official `A:`); the instruction opens the first user turn; the question's own
# turn comes last, and the CoT so far is the start of the assistant's reply, which the model continues.
# SearChain: the worked example is a user turn and the assistant's chain; the question is the next turn.
# ---------------------------------------------------------------------------------------------------

IRCOT_PARAGRAPH_WORDS = 350  # paragraph text shown to the model is cut to this many words

IRCOT_COT_INSTRUCTION = (
    "Answer the question by reasoning step by step from the Wikipedia paragraphs, one short sentence "
    'at a time. When the answer is known, write "So the answer is: <answer>."'
)
IRCOT_DIRECT_READER_INSTRUCTION = (
    "Answer the question using the Wikipedia paragraphs where they are given. Reply with the answer "
    "only, in a few words, without explaining."
)
IRCOT_COT_READER_INSTRUCTION = (
    "Answer the question by reasoning step by step from the Wikipedia paragraphs where they are given, "
    'and end with "So the answer is: <answer>."'
)


def ircot_paragraph(title: str, text: str, max_words: int = IRCOT_PARAGRAPH_WORDS) -> str:
    """One paragraph as IRCoT shows it: `Wikipedia Title: {title}` then the text cut to `max_words`."""
    return f"Wikipedia Title: {title}\n{' '.join(text.split()[:max_words])}"


def ircot_question(paragraphs: Sequence[str], question: str) -> str:
    """A question's user turn: rendered paragraphs (blank-line joined), then `Q: {question}`."""
    return "\n\n".join([*paragraphs, f"Q: {question}"])


def ircot_messages(
    instruction: str, demos: Sequence[tuple[str, str]], question: str, reply_start: str = ""
) -> list[Message]:
    """The chat turns: each demonstration's (user, assistant) pair, then the question's user turn, the
    instruction opening the first user turn; a non-empty `reply_start` (the CoT so far) opens the
    assistant's reply, which the model continues."""
    users = [user for user, _ in demos] + [question]
    users[0] = f"{instruction}\n\n{users[0]}"
    messages: list[Message] = []
    for user, (_, reply) in zip(users, demos, strict=False):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    messages.append({"role": "user", "content": users[-1]})
    if reply_start:
        messages.append({"role": "assistant", "content": reply_start})
    return messages


SEARCHAIN_INSTRUCTION = """Answer the question by building a chain of queries. Each node of the chain is one simple query for a search engine, written "[Query k]: ...", followed by its answer, written "[Answer k]: ...". When you do not know the answer of a query, write "[Unsolved Query]: ..." with the query again instead of an answer. Number the nodes 1, 2, 3, ... and use the answers of earlier nodes in later queries. End with "[Final Content]: ...", which answers the question from the nodes, cites each node it uses as [k], and ends with "So the answer is: <answer>."

Question: {question}"""

SEARCHAIN_EXAMPLE_QUESTION = "In which country was the director of the film Blue Harbour born?"
SEARCHAIN_EXAMPLE_CHAIN = """[Query 1]: Who is the director of the film Blue Harbour?
[Answer 1]: Mara Velden
[Query 2]: In which country was Mara Velden born?
[Answer 2]: Norway
[Final Content]: The film Blue Harbour was directed by Mara Velden [1], who was born in Norway [2]. So the answer is: Norway."""

SEARCHAIN_FEEDBACK = """According to this reference, the answer to "{query}" should be "{answer}". You can change your answer and continue the chain of queries for the question: {question}

Reference: {reference}"""


def searchain_messages(question: str) -> list[Message]:
    """SearChain's opening turns: the instruction with the example's question, the example's chain as
    the assistant's reply, then the question in the same format."""
    return [
        {"role": "user", "content": SEARCHAIN_INSTRUCTION.replace("{question}", SEARCHAIN_EXAMPLE_QUESTION)},
        {"role": "assistant", "content": SEARCHAIN_EXAMPLE_CHAIN},
        {"role": "user", "content": f"Question: {question}"},
    ]


def searchain_feedback(question: str, query: str, answer: str, reference: str) -> Message:
    """A verification result sent back as a new user turn: the reader's answer and its document."""
    content = SEARCHAIN_FEEDBACK.format(query=query, answer=answer, question=question, reference=reference)
    return {"role": "user", "content": content}


# Search-R1 ------------------------------------------------------------------------------------------
# Compatibility strings: released Search-R1 checkpoints were trained on exactly these bytes. Sources in
# PeterGriffinJin/Search-R1: the instruction is `make_prefix` (template_type "base") of
# scripts/data_process/nq_search.py, read in the fork Hazoom/Search-R1 at b660b6c (the upstream file is
# not in our index; the same bytes appear in the copies of infer.py); the information block, the
# invalid-action message and the document lines are `execute_predictions` and `_passages2string` of
# search_r1/llm_agent/generation.py at 8b416d2.

SEARCH_R1_INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search> and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> "
    "and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)
SEARCH_R1_INFORMATION = "\n\n<information>{documents}</information>\n\n"
SEARCH_R1_INVALID = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)


def search_r1_question(question: str) -> str:
    """The question as the release's data scripts write it: stripped, ending in a question mark."""
    question = question.strip()
    return question if question.endswith("?") else f"{question}?"


def search_r1_prompt(question: str) -> str:
    """The user turn of a Search-R1 conversation."""
    return SEARCH_R1_INSTRUCTION.replace("{question}", search_r1_question(question))


def search_r1_information(passages: Sequence[Passage]) -> str:
    """Retrieved documents as the release inserts them after a search: `Doc i(Title: t) text` lines
    (a document's first line is its title there, the rest its text), stripped, in <information> tags."""
    lines = "".join(f"Doc {i}(Title: {p.title}) {p.contents}\n" for i, p in enumerate(passages, start=1))
    return SEARCH_R1_INFORMATION.replace("{documents}", lines.strip())


def search_r1_messages(question: str, pieces: Sequence[str] = ()) -> list[Message]:
    """The conversation so far: the instruction as the user turn and, once the model has written,
    everything since (its turns and the inserted blocks, in order) as an assistant turn the model
    continues, tokenized piece by piece after the generation prompt as the release builds its ids
    (corag.lm.render.PIECES)."""
    messages: list[Message] = [{"role": "user", "content": search_r1_prompt(question)}]
    if pieces:
        messages.append({"role": "assistant", "content": "".join(pieces), "pieces": list(pieces)})  # type: ignore[dict-item]
    return messages
