"""SearChain: the Chain-of-Query parser, verification and feedback rounds (scripted LM), tracing."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

from hypothesis import example, given, settings
from hypothesis import strategies as st

from corag.executor import Context, Executor
from corag.lm.base import Completion, GenerationRequest, Message, Score, ScoreRequest
from corag.methods.searchain import CONFIDENCE_THRESHOLD, chain_answer, parse_chain, searchain
from corag.types import Example, Hit, Passage, Usage

WELL_FORMED = """[Query 1]: Who is the director of Blue Harbour?
[Answer 1]: Mara Velden
[Query 2]: Where was Mara Velden born?
[Unsolved Query]: Where was Mara Velden born?
[Query 3]: What country is Oslo in?
[Answer 3]: Norway
[Final Content]: Blue Harbour was directed by Mara Velden [1], born in Oslo [2], in Norway [3]. So the answer is: Norway."""


def test_parse_well_formed_chain() -> None:
    chain = parse_chain(WELL_FORMED)
    assert [(n.number, n.label, n.query, n.answer) for n in chain.nodes] == [
        (1, 1, "Who is the director of Blue Harbour?", "Mara Velden"),
        (2, 2, "Where was Mara Velden born?", None),
        (3, 3, "What country is Oslo in?", "Norway"),
    ]
    assert [n.unsolved for n in chain.nodes] == [False, True, False]
    assert chain.final_content.startswith("Blue Harbour was directed")
    assert chain.markers() == [1, 2, 3]
    assert chain.answer == "Norway"


def test_parse_malformed_chains() -> None:
    # extra text, missing colon and spaces, bad numbering, a missing answer, a stray answer,
    # a duplicated node, a hallucinated second example after the final content
    text = """Sure! Here is the chain.
[Query1] Who is the director of Blue Harbour?
[Answer 1]: Mara Velden
some commentary the parser ignores
[Answer 1]: Stray answer
[Query 4]: Where was Mara Velden born?
[Query 5]: Who is the director of blue harbour
[Answer 5]: Someone Else
[ query 7 ]: What country is Oslo in?
[ANSWER 2]: Norway
[Final Content]: It is Norway [7] and [4, 1]. So the answer is: Norway.
Question: next?
[Query 1]: hallucinated"""
    chain = parse_chain(text)
    assert [(n.number, n.label, n.query, n.answer) for n in chain.nodes] == [
        (1, 1, "Who is the director of Blue Harbour?", "Mara Velden"),
        (2, 4, "Where was Mara Velden born?", None),  # no answer: unsolved
        (3, 7, "What country is Oslo in?", "Norway"),
    ]
    assert chain.labels == {1: 1, 4: 2, 5: 1, 7: 3}
    assert chain.markers() == [7, 4, 1]
    assert [chain.node_for_marker(m).number for m in chain.markers()] == [3, 2, 1]
    assert chain.node_for_marker(2).number == 2  # no such label: the second node
    assert chain.node_for_marker(9) is None
    assert chain.final_content == "It is Norway [7] and [4, 1]. So the answer is: Norway.\nQuestion: next?"

    no_final_text = "[Query 1]: A?\n[Answer 1]: B\n[Query 2]: C?\n[Answer 2]: D\n"
    no_final = parse_chain(no_final_text)
    assert no_final.final_content is None and no_final.answer == ""
    assert chain_answer(no_final, no_final_text) == ("D", "last_node")
    unsolved_only = parse_chain("[Unsolved Query]: Where is Oslo?\n[Final Content]: Oslo is in Norway [1].")
    assert [(n.query, n.unsolved) for n in unsolved_only.nodes] == [("Where is Oslo?", True)]
    assert unsolved_only.answer == "Oslo is in Norway"
    empty = parse_chain("no tags at all")
    assert empty.nodes == () and empty.answer == "" and empty.markers() == []
    assert parse_chain("[Query 1]:\n[Answer 1]: x\n[Final Content]:").nodes == ()


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@example(parts=["[Query 1]:", "0", "[Answer 1]:", "[1]"])  # an answer that is only a marker
@given(
    st.lists(
        st.one_of(
            st.sampled_from(
                [
                    "[Query 1]:",
                    "[Query 2]",
                    "[Answer 1]:",
                    "[Answer 9]:",
                    "[Unsolved Query]:",
                    "[Final Content]:",
                    "[1]",
                    "[2, 3]",
                    "[",
                    "]",
                    "\n",
                    ":",
                    " ",
                ]
            ),
            st.text(max_size=12),
        ),
        max_size=30,
    )
)
def test_parser_never_raises(parts: list[str]) -> None:
    text = "".join(parts)
    chain = parse_chain(text)
    assert isinstance(chain.answer, str)
    # any text with a word outside the tags and markers gives an answer
    answer, _ = chain_answer(chain, text)
    words = re.sub(r"\[[^\]]*\]", " ", text)
    assert bool(answer) or not re.search(r"\w", words)
    for marker in chain.markers():
        chain.node_for_marker(marker)
    assert [n.number for n in chain.nodes] == list(range(1, len(chain.nodes) + 1))


OPENING = 3  # the worked example's two turns and the question


class ScriptedLM:
    """Control-flow stand-in: `chain(round)` writes chains, `read(query)` the reader's answers,
    `confidence(query)` the reader's log-probability per token. A token is a word."""

    def __init__(
        self,
        chain: Callable[[int], str],
        read: Callable[[str], str],
        confidence: Callable[[str], float] = lambda q: -0.05,
    ) -> None:
        self.chain, self.read, self.confidence = chain, read, confidence
        self.requests: list[GenerationRequest] = []
        self.scored: list[ScoreRequest] = []

    @staticmethod
    def reader_query(messages: Sequence[Message]) -> str | None:
        content = messages[-1]["content"]
        if not content.startswith("Given the following documents"):
            return None
        return content.split("## Query\n")[1].split("\n")[0]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for r in requests:
            self.requests.append(r)
            query = self.reader_query(r.messages)
            if query is None:
                text = self.chain(sum(m["role"] == "assistant" for m in r.messages[OPENING:]) + 1)
            else:
                text = self.read(query)
            out.append(
                Completion((text,), Usage(self.count_prompt_tokens(r.messages), len(text.split()) + 1, 1))
            )
        return out

    def score(self, requests: Sequence[ScoreRequest]) -> list[Score]:
        self.scored += list(requests)
        out = []
        for r in requests:
            value = self.confidence(self.reader_query(r.messages) or "")
            out.append(Score((value, value), Usage(self.count_score_tokens(r), 0, 1)))
        return out

    def count_prompt_tokens(self, messages: Sequence[Message]) -> int:
        return sum(len(m["content"].split()) + 2 for m in messages) + 1

    def count_score_tokens(self, request: ScoreRequest) -> int:
        return self.count_prompt_tokens(request.messages) + len(request.target.split()) + 1

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def truncate_tokens(self, text: str, max_tokens: int, *, middle: bool = False) -> str:
        return " ".join(text.split()[:max_tokens])

    @property
    def max_context(self) -> int:
        return 100_000

    def chain_requests(self) -> list[GenerationRequest]:
        return [r for r in self.requests if self.reader_query(r.messages) is None]


class DictCorpus:
    def __init__(self, passages: Sequence[Passage]) -> None:
        self.passages = {p.id: p for p in passages}

    def get_many(self, ids: Sequence[str]) -> list[Passage]:
        return [self.passages[i] for i in ids]


class KeywordRetriever:
    """Top hit: the passage whose title occurs in the query (records queries and k)."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.passages = passages
        self.asked: list[tuple[str, int]] = []

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.asked += [(q, k) for q in queries]
        return [[Hit(p.id, 1.0) for p in self.passages if p.title.lower() in q.lower()][:k] for q in queries]


PASSAGES = [
    Passage("d-harbour", "Blue Harbour", "Blue Harbour is a film directed by Mara Velden."),
    Passage("d-mara", "Mara Velden", "Mara Velden was born in Oslo."),
    Passage("d-oslo", "Oslo", "Oslo is a city in Norway."),
]
FACTS = {"Blue Harbour": "Mara Velden", "Mara Velden": "Oslo", "Oslo": "Norway"}
QUESTION = Example("q1", "In which country was the director of Blue Harbour born?", ("Norway",))


def reader(query: str) -> str:
    return next(
        (answer for title, answer in FACTS.items() if title in query), "No relevant information found"
    )


def run(lm: ScriptedLM, **kw) -> tuple[dict, KeywordRetriever]:
    retriever = KeywordRetriever(PASSAGES)
    ctx = Context(lm, retriever)
    record = Executor(lm, retriever).run([searchain(ctx, QUESTION, corpus=DictCorpus(PASSAGES), **kw)])[0]
    return record, retriever


def chain_text(answers: Sequence[str | None], final: str = "So the answer is: Norway.") -> str:
    queries = ["Who directed Blue Harbour?", "Where was Mara Velden born?", "Which country is Oslo in?"]
    lines = []
    for k, (query, answer) in enumerate(zip(queries, answers, strict=True), start=1):
        lines.append(f"[Query {k}]: {query}")
        lines.append(f"[Answer {k}]: {answer}" if answer is not None else f"[Unsolved Query]: {query}")
    return "\n".join([*lines, f"[Final Content]: Cited [1] [2] [3]. {final}"])


def test_a_correct_chain_passes_in_one_round_and_is_traced() -> None:
    lm = ScriptedLM(lambda r: chain_text(["Mara Velden", "Oslo", "Norway"]), reader)
    record, retriever = run(lm)
    assert record["passed"] and len(record["rounds"]) == 1 and "feedback" not in record["rounds"][0]
    assert [q for q, _ in retriever.asked] == [
        "Who directed Blue Harbour?",
        "Where was Mara Velden born?",
        "Which country is Oslo in?",
    ]
    assert all(k == 1 for _, k in retriever.asked)  # top-1 document per node
    assert record["doc_ids"] == ["d-harbour", "d-mara", "d-oslo"]
    assert [(t["marker"], t["doc_id"]) for t in record["trace"]] == [
        (1, "d-harbour"),
        (2, "d-mara"),
        (3, "d-oslo"),
    ]
    assert record["predictions"] == "Norway"
    assert [s["doc_ids"] for s in record["steps"]] == [["d-harbour"], ["d-mara"], ["d-oslo"]]
    # each reader answer is scored as the confidence, with the reader's own prompt
    assert [s.target for s in lm.scored] == ["Mara Velden", "Oslo", "Norway"]


def test_feedback_only_for_the_first_failing_node() -> None:
    chains = {
        1: chain_text(["Mara Velden", "Bergen", "Sweden"], "So the answer is: Sweden."),
        2: chain_text(["Mara Velden", "Oslo", "Norway"]),
    }
    lm = ScriptedLM(lambda r: chains[r], reader)
    record, retriever = run(lm)
    first, second = record["rounds"]
    assert first["feedback"]["node"] == 2 and first["feedback"]["answer"] == "Oslo"
    assert first["feedback"]["doc_id"] == "d-mara" and not first["feedback"]["unsolved"]
    # node 3 (also wrong) was not verified in round 1: verification stopped at the first failure
    assert [q for q, _ in retriever.asked] == [
        "Who directed Blue Harbour?",
        "Where was Mara Velden born?",
        "Which country is Oslo in?",  # round 2: nodes 1 and 2 were verified before, only node 3 is new
    ]
    second_request = lm.chain_requests()[1].messages
    assert [m["role"] for m in second_request] == ["user", "assistant", "user", "assistant", "user"]
    assert second_request[2]["content"].endswith(QUESTION.query)
    assert second_request[3]["content"] == chains[1]
    feedback = second_request[4]["content"]
    assert '"Where was Mara Velden born?"' in feedback and '"Oslo"' in feedback
    assert "Mara Velden was born in Oslo." in feedback and QUESTION.query in feedback
    assert "feedback" not in second and record["passed"] and record["predictions"] == "Norway"
    assert [(t["marker"], t["doc_id"]) for t in record["trace"]] == [
        (1, "d-harbour"),
        (2, "d-mara"),
        (3, "d-oslo"),
    ]


def test_no_correction_when_the_reader_is_unsure_or_agrees() -> None:
    unsure = ScriptedLM(lambda r: chain_text(["Mara Velden", "Bergen", "Norway"]), reader, lambda q: -2.0)
    record, _ = run(unsure)
    assert record["passed"] and len(record["rounds"]) == 1
    # contained after normalisation: "The Oslo area" contains "oslo"
    agrees = ScriptedLM(lambda r: chain_text(["Mara Velden", "The Oslo area!", "Norway"]), reader)
    record, _ = run(agrees)
    assert record["passed"] and len(record["rounds"]) == 1
    assert -0.21 < CONFIDENCE_THRESHOLD < -0.2 and math.isclose(
        math.exp(CONFIDENCE_THRESHOLD), 1 / (1 + math.exp(-1.5))
    )


def test_unsolved_nodes_are_always_answered() -> None:
    chains = {
        1: chain_text(["Mara Velden", None, None]),
        2: chain_text(["Mara Velden", "Oslo", None]),
        3: chain_text(["Mara Velden", "Oslo", "Norway"]),
    }
    lm = ScriptedLM(lambda r: chains[r], reader, lambda q: -9.0)  # never confident
    record, _ = run(lm)
    feedback = [r.get("feedback") for r in record["rounds"]]
    assert [f["node"] if f else None for f in feedback] == [2, 3, None]
    assert all(f["unsolved"] for f in feedback[:2])
    assert [f["answer"] for f in feedback[:2]] == ["Oslo", "Norway"]
    assert record["passed"] and record["predictions"] == "Norway"


def test_rounds_capped_at_five() -> None:
    def chain(r: int) -> str:  # a new unsolved query every round, so every round sends feedback
        return f"[Query 1]: Where was Mara Velden born, try {r}?\n[Unsolved Query]: same\n[Final Content]: unknown [1]"

    lm = ScriptedLM(chain, reader)
    record, _ = run(lm)
    assert len(record["rounds"]) == 5 and len(lm.chain_requests()) == 5
    assert not record["passed"] and record["stop_reason"] == "max_rounds"
    assert all("feedback" in r for r in record["rounds"])
    record, _ = run(ScriptedLM(chain, reader), max_rounds=2)
    assert len(record["rounds"]) == 2


def test_tracing_maps_markers_to_retrieved_documents_only() -> None:
    text = """[Query 1]: Who directed Blue Harbour?
[Answer 1]: Mara Velden
[Query 2]: Who is the producer of Blue Harbour?
[Answer 2]: Unknown Person
[Query 3]: Where was Mara Velden born?
[Answer 3]: Oslo
[Final Content]: Mara Velden [1] was born in Oslo [3]; produced [2]; see also [8]. So the answer is: Oslo."""

    # the reader finds nothing confident for node 2's document, so nothing is fed back
    def unsure_of_producers(query: str) -> float:
        return -5.0 if "producer" in query else -0.05

    lm = ScriptedLM(lambda r: text, reader, unsure_of_producers)
    record, _ = run(lm)
    assert record["passed"]
    trace = {t["marker"]: (t["node"], t["doc_id"]) for t in record["trace"]}
    assert trace == {1: (1, "d-harbour"), 3: (3, "d-mara"), 2: (2, "d-harbour"), 8: (None, None)}

    # a node never retrieved (verification stopped before it, rounds exhausted) traces to no document
    lm = ScriptedLM(lambda r: text.replace("Oslo", "Bergen"), reader, unsure_of_producers)
    record, _ = run(lm, max_rounds=1)
    trace = {t["marker"]: t["doc_id"] for t in record["trace"]}
    assert not record["passed"] and trace[3] == "d-mara"
    lm = ScriptedLM(lambda r: text.replace("[Answer 1]: Mara Velden", "[Answer 1]: Nobody"), reader)
    record, _ = run(lm, max_rounds=1)
    trace = {t["marker"]: t["doc_id"] for t in record["trace"]}
    assert trace == {1: "d-harbour", 3: None, 2: None, 8: None}


def test_tokens_are_the_sum_of_the_recorded_calls() -> None:
    chains = {
        1: chain_text(["Mara Velden", "Bergen", "Sweden"]),
        2: chain_text(["Mara Velden", "Oslo", "Norway"]),
    }
    lm = ScriptedLM(lambda r: chains[r], reader)
    record, _ = run(lm)
    total = sum(c["prompt_tokens"] + c["completion_tokens"] for c in record["calls"])
    assert record["tokens"] == total == record["usage"]["total_tokens"] > 0
    assert record["model_calls"] == len(record["calls"]) == len(lm.requests) + len(lm.scored)
    assert [c["purpose"] for c in record["calls"]][:3] == ["chain", "reader", "confidence"]


PLAIN_REPLIES = [
    # (a chat model's reply without a final content, the answer taken from it, the fallback used)
    (
        "Blue Harbour was directed by Mara Velden, born in Oslo.\nThe answer is: Norway.",
        "Norway",
        "answer_is",
    ),
    ("So the answer is: Sweden. Wait, the answer is: Norway [2].", "Norway", "answer_is"),
    (
        "[Query 1]: Who directed Blue Harbour?\n[Answer 1]: Mara Velden\n[Query 2]: Mara Velden's country?\n"
        "[Answer 2]: Norway\n",
        "Norway",
        "last_node",
    ),  # fmt: skip
    (
        "The director of Blue Harbour was born in Norway. Norway is in Europe.",
        "Norway is in Europe",
        "last_sentence",
    ),  # fmt: skip
    ("Norway", "Norway", "last_sentence"),
    ("The answer is: Norway.\n[Final Content]: [1] [2].", "Norway", "answer_is"),  # final content, no answer
]


def test_an_answer_written_as_plain_text_is_taken_from_the_text() -> None:
    for text, answer, fallback in PLAIN_REPLIES:
        lm = ScriptedLM(lambda r, text=text: text, reader, lambda q: -9.0)
        record, _ = run(lm)
        assert record["predictions"] == answer, text
        assert record["answer_source"] == "text" and record["answer_fallback"] == fallback
        assert record["parse_failures"] == int("[Final Content]" not in text)


def test_answer_sources_and_parse_failures_are_recorded() -> None:
    record, _ = run(ScriptedLM(lambda r: chain_text(["Mara Velden", "Oslo", "Norway"]), reader))
    assert record["answer_source"] == "format" and record["answer_fallback"] is None
    assert record["parse_failures"] == 0
    chains = {1: "I do not know.", 2: chain_text(["Mara Velden", "Oslo", "Norway"])}
    # a chain without nodes needs no feedback: it is final, answered from its text
    record, _ = run(ScriptedLM(lambda r: chains[r], reader))
    assert record["predictions"] == "I do not know" and record["parse_failures"] == 1
    record, _ = run(ScriptedLM(lambda r: "   ", reader))
    assert record["predictions"] == "" and record["answer_source"] == "none"
