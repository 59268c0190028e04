"""SearChain: the model writes a whole Chain-of-Query; retrieval verifies it node by node.

Per round the model writes a chain of `[Query k]` nodes, each answered (`[Answer k]`) or marked
`[Unsolved Query]`, and a `[Final Content]` citing nodes as `[k]`. Walking the nodes in order (skipping
queries verified in earlier rounds), each query retrieves its top-1 document and a reader answers from
it. The first node that needs it gets feedback as a new user turn: an unsolved node always, an answered
node when the reader is confident and disagrees. The model then writes a new chain; a chain that needs no
feedback (one without any parseable node has nothing to verify), or the fifth, is final. Its `[k]`
markers are traced to the documents of nodes k. Verified queries are keyed by their normalised text.

The answer is the final content's; a chain without one (a chat model often answers in plain text) is
answered from its text: the last "answer is: X", else its last answered node, else its last sentence.
Records say which (`answer_source`, `answer_fallback`) and count the chains without final content
(`parse_failures`).

The reader: SearChain used an extractive DPR reader whose relevance logit had to exceed 1.5. Here the
reader is generative: CoRAG's sub-answer call over the one document, answered greedily, with confidence
the mean log-probability of that answer (ctx.score; its content and end-of-turn tokens). The default
threshold maps the official one to a probability: sigmoid(1.5) = 0.82, and log(0.82) = -0.20 is the
mean token log-probability required. An answer is "confident" strictly above the threshold.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from corag.budget import BudgetExceeded
from corag.executor import Context
from corag.lm.base import GenerationRequest, Message, ScoreRequest
from corag.methods.ircot import extract_answer, last_sentence, metered_generate, result_record
from corag.prompts import NO_INFO, format_document, searchain_feedback, searchain_messages, subanswer_messages
from corag.types import Example, Passage

if TYPE_CHECKING:
    from corag.data.corpus import Corpus

CONFIDENCE_THRESHOLD = -math.log1p(math.exp(-1.5))  # log(sigmoid(1.5)) = -0.2014
MAX_ROUNDS = 5

_TAG = re.compile(r"\[\s*(query|answer|unsolved\s+query|final\s+content)\s*(\d+)?\s*\]\s*:?", re.IGNORECASE)
_MARKER = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)\s*\]")


def normalize(text: str) -> str:
    """SQuAD normalisation (corag.metrics), imported where used."""
    from corag.metrics import normalize_answer

    return normalize_answer(text)


@dataclass(frozen=True)
class Node:
    """One query of a chain: `number` is its position (1-based), `label` the number the model wrote.

    `answer` is None for an unsolved query: marked `[Unsolved Query]`, or left without an answer.
    """

    number: int
    label: int | None
    query: str
    answer: str | None

    @property
    def unsolved(self) -> bool:
        return self.answer is None


@dataclass(frozen=True)
class ParsedChain:
    nodes: tuple[Node, ...] = ()
    final_content: str | None = None
    labels: dict[int, int] = field(default_factory=dict)  # model's number -> node position

    def node_for_marker(self, marker: int) -> Node | None:
        """The node a `[k]` marker cites: the model's own numbering first, else the k-th node."""
        position = self.labels.get(marker, marker)
        return self.nodes[position - 1] if 1 <= position <= len(self.nodes) else None

    def markers(self) -> list[int]:
        """The node numbers cited in the final content, in order of first citation."""
        groups = _MARKER.findall(self.final_content or "")
        return list(dict.fromkeys(int(x) for group in groups for x in group.split(",")))

    @property
    def answer(self) -> str:
        """The final content's answer: after "answer is:", else the final content without markers
        (empty without final content)."""
        if self.final_content is None:
            return ""
        extracted = extract_answer(self.final_content)
        return _clean(self.final_content if extracted is None else extracted)


def _clean(text: str) -> str:
    """Text without `[k]` markers and chain tags, whitespace collapsed, one trailing full stop dropped."""
    text = " ".join(_MARKER.sub(" ", _TAG.sub(" ", text)).split())
    return text[:-1].rstrip() if text.endswith(".") else text


def chain_answer(chain: ParsedChain, text: str) -> tuple[str, str | None]:
    """The answer of a generated chain and the fallback that gave it (None: the final content).

    Without an answer in final content: the last "answer is: X" of the text ("answer_is"), else the
    last answered node's answer ("last_node"), else the text's last sentence ("last_sentence")."""
    if chain.answer:
        return chain.answer, None
    *_, stated = re.split(r"answer is:?\s", text, flags=re.IGNORECASE)
    stated = _clean(stated.split("\n")[0]) if stated != text else ""
    if stated:
        return stated, "answer_is"
    answered = [answer for n in chain.nodes if n.answer and (answer := _clean(n.answer))]
    if answered:
        return answered[-1], "last_node"
    sentence = last_sentence(_clean(text))
    return sentence, ("last_sentence" if sentence else None)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def parse_chain(text: str) -> ParsedChain:
    """Parse a generated Chain-of-Query; never raises on model output.

    Tolerates: text around the tags; missing colons or numbers; bad numbering (nodes are numbered by
    position, the model's numbers kept as labels for markers); an answer missing (the node counts as
    unsolved); stray answers (ignored); repeated queries (the first kept); no final content. Parsing
    stops at the first `[Final Content]`, which runs to the next tag or the end.
    """
    tags = list(_TAG.finditer(text))
    drafts: list[dict[str, Any]] = []  # label, query, answer, closed
    final_content = None
    for i, tag in enumerate(tags):
        end = tags[i + 1].start() if i + 1 < len(tags) else len(text)
        content = text[tag.end() : end]
        kind = " ".join(tag.group(1).lower().split())
        label = int(tag.group(2)) if tag.group(2) else None
        current = drafts[-1] if drafts and not drafts[-1]["closed"] else None
        if kind == "final content":
            final_content = content.strip()
            break
        if kind == "query":
            if current is not None:
                current["closed"] = True
            drafts.append({"label": label, "query": _first_line(content), "answer": None, "closed": False})
        elif kind == "answer" and current is not None:
            current["answer"] = _first_line(content) or None
            current["closed"] = True
        elif kind == "unsolved query":
            if current is not None:
                current["query"] = current["query"] or _first_line(content)
                current["closed"] = True
            else:
                drafts.append({"label": label, "query": _first_line(content), "answer": None, "closed": True})
    nodes: list[Node] = []
    labels: dict[int, int] = {}
    seen: dict[str, int] = {}
    for draft in drafts:
        key = " ".join(re.findall(r"\w+", draft["query"].lower()))
        if not key:
            continue
        position = seen.get(key)
        if position is None:
            nodes.append(Node(len(nodes) + 1, draft["label"], draft["query"], draft["answer"]))
            position = seen[key] = len(nodes)
        if draft["label"] is not None:
            labels.setdefault(draft["label"], position)
    return ParsedChain(tuple(nodes), final_content, labels)


@dataclass(frozen=True)
class Verification:
    """The reader's check of one node: its top-1 document, the reader's answer and its confidence."""

    query: str
    doc: Passage | None
    answer: str
    confidence: float


def needs_feedback(node: Node, check: Verification, threshold: float = CONFIDENCE_THRESHOLD) -> bool:
    """Unsolved: always (when a document was found). Answered: when the reader is confident and its
    normalised answer is not contained in the model's normalised answer."""
    if check.doc is None:
        return False
    if node.unsolved:
        return True
    if check.confidence <= threshold or not check.answer or check.answer == NO_INFO:
        return False
    return normalize(check.answer) not in normalize(node.answer or "")


async def verify(
    ctx: Context, corpus: Corpus, calls: list[dict[str, Any]], query: str, max_new_tokens: int = 32
) -> Verification:
    """Retrieve the top-1 document for a node's query; answer it greedily from that document (CoRAG's
    sub-answer call; the first non-empty line is the answer) and score the answer's mean
    log-probability as the confidence. An empty answer is not scored: its confidence is -inf."""
    hits = await ctx.search(query, 1)
    if not hits:
        return Verification(query, None, "", -math.inf)
    doc = corpus.get_many([hits[0].doc_id])[0]
    messages = tuple(subanswer_messages(query, [doc], tok=ctx.lm))
    request = GenerationRequest(messages, max_new_tokens=max_new_tokens)
    answer = _first_line((await metered_generate(ctx, calls, "reader", request)).texts[0])
    if not answer:
        return Verification(query, doc, "", -math.inf)
    score = await ctx.score(ScoreRequest(messages, answer))
    calls.append(
        {
            "purpose": "confidence",
            "kind": "score",
            "prompt_tokens": score.usage.prompt_tokens,
            "completion_tokens": score.usage.completion_tokens,
        }
    )
    return Verification(query, doc, answer, score.mean)


def fit_dialogue(ctx: Context, messages: list[Message], limit: int, opening: int = 3) -> list[Message]:
    """Drop the oldest (chain, feedback) turn pairs after the `opening` turns (the worked example and
    the question) until the dialogue fits."""
    messages = list(messages)
    while len(messages) > opening + 2 and ctx.lm.count_prompt_tokens(messages) > limit:
        del messages[opening : opening + 2]
    return messages


def trace(chain: ParsedChain, checks: dict[str, Verification]) -> list[dict[str, Any]]:
    """Each `[k]` marker of the final content, its node and the document retrieved for it (or None)."""
    traced = []
    for marker in chain.markers():
        node = chain.node_for_marker(marker)
        check = checks.get(normalize(node.query)) if node is not None else None
        traced.append(
            {
                "marker": marker,
                "node": node.number if node is not None else None,
                "query": node.query if node is not None else None,
                "doc_id": check.doc.id if check is not None and check.doc is not None else None,
            }
        )
    return traced


def _nodes_json(chain: ParsedChain) -> list[dict[str, Any]]:
    return [{"number": n.number, "label": n.label, "query": n.query, "answer": n.answer} for n in chain.nodes]


async def searchain(
    ctx: Context,
    example: Example,
    *,
    corpus: Corpus,
    max_rounds: int = MAX_ROUNDS,
    confidence_threshold: float = CONFIDENCE_THRESHOLD,
    chain_max_new_tokens: int = 256,
    reader_max_new_tokens: int = 32,
) -> dict[str, Any]:
    """SearChain for one question; returns its result record (prediction, rounds, trace, tokens, calls)."""
    calls: list[dict[str, Any]] = []
    doc_ids: list[str] = []
    checks: dict[str, Verification] = {}  # normalised query -> its verification, across rounds
    rounds: list[dict[str, Any]] = []
    messages: list[Message] = searchain_messages(example.query)
    opening = len(messages)
    chain, text, passed, stop_reason = ParsedChain(), "", False, "max_rounds"
    limit = ctx.lm.max_context - chain_max_new_tokens
    for _ in range(max_rounds):
        messages = fit_dialogue(ctx, messages, limit, opening)
        request = GenerationRequest(tuple(messages), max_new_tokens=chain_max_new_tokens)
        try:
            text = (await metered_generate(ctx, calls, "chain", request)).texts[0]
        except BudgetExceeded:
            stop_reason = "budget"
            break
        chain = parse_chain(text)
        feedback = None
        try:
            for node in chain.nodes:
                key = normalize(node.query)
                if key in checks:
                    continue
                checks[key] = check = await verify(ctx, corpus, calls, node.query, reader_max_new_tokens)
                if check.doc is not None:
                    doc_ids.append(check.doc.id)
                if needs_feedback(node, check, confidence_threshold):
                    feedback = (node, check)
                    break
        except BudgetExceeded:
            stop_reason = "budget"
        record: dict[str, Any] = {
            "chain": text,
            "nodes": _nodes_json(chain),
            "final_content": chain.final_content,
        }
        if feedback is not None:
            node, check = feedback
            assert check.doc is not None
            record["feedback"] = {
                "node": node.number,
                "query": node.query,
                "unsolved": node.unsolved,
                "answer": check.answer,
                "confidence": check.confidence if math.isfinite(check.confidence) else None,
                "doc_id": check.doc.id,
            }
            reference = format_document(check.doc)
            messages = [
                *messages,
                {"role": "assistant", "content": text},
                searchain_feedback(example.query, node.query, check.answer, reference),
            ]
        rounds.append(record)
        if stop_reason == "budget":
            break
        if feedback is None:
            passed, stop_reason = True, "passed"
            break
    traced = trace(chain, checks)
    answer, fallback = chain_answer(chain, text)
    steps = []
    for node in chain.nodes:
        check = checks.get(normalize(node.query))
        doc = [check.doc.id] if check is not None and check.doc is not None else []
        steps.append({"subquery": node.query, "subanswer": node.answer or "", "doc_ids": doc})
    return result_record(
        ctx,
        example,
        "searchain",
        answer,
        doc_ids,
        list(dict.fromkeys(d for step in steps for d in step["doc_ids"])),
        calls,
        subqueries=[s["subquery"] for s in steps],
        subanswers=[s["subanswer"] for s in steps],
        steps=steps,
        final_content=chain.final_content,
        trace=traced,
        rounds=rounds,
        passed=passed,
        stop_reason=stop_reason,
        answer_source="none" if not answer else "text" if fallback else "format",
        answer_fallback=fallback,
        parse_failures=sum(r["final_content"] is None for r in rounds),
    )
