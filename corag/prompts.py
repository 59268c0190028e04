"""Every prompt of every method, in one place.

The three CoRAG calls (sub-query, sub-answer, final answer) reproduce byte for byte the strings the
released CoRAG checkpoints were trained on; change them and those checkpoints stop working. Each call is
one user message, rendered later with the model's own chat template.
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


def parse_subquery(text: str, first_line: bool = False) -> str:
    """Clean a generated sub-query: strip, drop surrounding quotes and a leading label (as the release
    does); with `first_line`, first keep only its first non-empty line (corag.settings.GenerationLimits)."""
    text = text.strip()
    if first_line:
        text = text.split("\n", 1)[0].strip()
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        text = text[1:-1].strip()
    return _LEADING_LABEL.sub("", text).strip()


# ---------------------------------------------------------------------------------------------------
# IRCoT and SearChain (corag/methods). Neither paper's checkpoints depend on exact strings, so these
# templates are the project's own wording. Both methods were designed for completion models; here each
# prompt is ONE user message (a chat model answers it as its assistant turn). IRCoT's message holds the
# demonstrations, the paragraphs, `Q: {question}` and the `A: {cot so far}` prefix that the model
# continues, exactly as a completion model would have seen them, behind one line of instruction.
# ---------------------------------------------------------------------------------------------------

IRCOT_PARAGRAPH_WORDS = 350  # paragraph text shown to the model is cut to this many words
IRCOT_DEMO_SEPARATOR = "\n\n\n"

IRCOT_COT_INSTRUCTION = (
    "Answer the last question in the style of the examples: reason step by step from the Wikipedia "
    'paragraphs, continuing the text after "A:" with the next sentence only. When the answer is known, '
    'write "So the answer is: <answer>."'
)
IRCOT_DIRECT_READER_INSTRUCTION = (
    "Answer the last question in the style of the examples, using the Wikipedia paragraphs where they "
    'are given. Write only the answer after "A:", do not explain yourself.'
)
IRCOT_COT_READER_INSTRUCTION = (
    "Answer the last question in the style of the examples: reason step by step from the Wikipedia "
    'paragraphs where they are given, and end with "So the answer is: <answer>."'
)


def ircot_paragraph(title: str, text: str, max_words: int = IRCOT_PARAGRAPH_WORDS) -> str:
    """One paragraph as IRCoT shows it: `Wikipedia Title: {title}` then the text cut to `max_words`."""
    return f"Wikipedia Title: {title}\n{' '.join(text.split()[:max_words])}"


def ircot_block(paragraphs: Sequence[str], question: str, answer: str) -> str:
    """Rendered paragraphs (blank-line joined), then `Q: {question}` and `A: {answer}`."""
    qa = f"Q: {question}\nA: {answer}".rstrip()
    return "\n\n".join([*paragraphs, qa])


def ircot_messages(instruction: str, demos: Sequence[str], block: str) -> list[Message]:
    """One user message: the instruction, the rendered demonstrations, then the question's block."""
    return _user(IRCOT_DEMO_SEPARATOR.join([instruction, *demos, block]))


SEARCHAIN_INSTRUCTION = """Answer the question by building a chain of queries. Each node of the chain is one simple query for a search engine, written "[Query k]: ...", followed by its answer, written "[Answer k]: ...". When you do not know the answer of a query, write "[Unsolved Query]: ..." with the query again instead of an answer. Number the nodes 1, 2, 3, ... and use the answers of earlier nodes in later queries. End with "[Final Content]: ...", which answers the question from the nodes, cites each node it uses as [k], and ends with "So the answer is: <answer>."

Example:
Question: In which country was the director of the film Blue Harbour born?
[Query 1]: Who is the director of the film Blue Harbour?
[Answer 1]: Mara Velden
[Query 2]: In which country was Mara Velden born?
[Answer 2]: Norway
[Final Content]: The film Blue Harbour was directed by Mara Velden [1], who was born in Norway [2]. So the answer is: Norway.

Question: {question}"""

SEARCHAIN_FEEDBACK = """According to this reference, the answer to "{query}" should be "{answer}". You can change your answer and continue the chain of queries for the question: {question}

Reference: {reference}"""


def searchain_messages(question: str) -> list[Message]:
    """SearChain's first turn: the Chain-of-Query instruction with one example, then the question."""
    return _user(SEARCHAIN_INSTRUCTION.replace("{question}", question))


def searchain_feedback(question: str, query: str, answer: str, reference: str) -> Message:
    """A verification result sent back as a new user turn: the reader's answer and its document."""
    content = SEARCHAIN_FEEDBACK.format(query=query, answer=answer, question=question, reference=reference)
    return {"role": "user", "content": content}
