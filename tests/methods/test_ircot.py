"""IRCoT control flow on constructed cases (a scripted LM), and its text helpers.

The end-to-end runs with the real tiny model and BM25 are in test_methods_e2e.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from corag.budget import Meter
from corag.executor import Context, Executor
from corag.lm.base import Completion, GenerationRequest, Message, Score, ScoreRequest
from corag.methods.baselines import no_retrieval, one_step
from corag.methods.demos import Demonstration, DemoParagraph
from corag.methods.ircot import (
    add_paragraphs,
    extract_answer,
    first_sentence,
    ircot,
    is_near_duplicate,
    is_reasoning_sentence,
    remove_wh_words,
    retrieval_query,
)
from corag.prompts import IRCOT_COT_INSTRUCTION
from corag.types import Example, Hit, Passage, Usage


class ScriptedLM:
    """Control-flow stand-in: replies come from a function of the request; a token is a word."""

    def __init__(self, reply: Callable[[GenerationRequest], str], max_context: int = 100_000) -> None:
        self.reply = reply
        self.requests: list[GenerationRequest] = []
        self._max_context = max_context

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for r in requests:
            self.requests.append(r)
            text = self.reply(r)
            for stop in r.stop:
                text = text.split(stop)[0]
            usage = Usage(self.count_prompt_tokens(r.messages), len(text.split()) + 1, 1)
            out.append(Completion((text,), usage))
        return out

    def score(self, requests: Sequence[ScoreRequest]) -> list[Score]:
        return [Score((-0.1,), Usage(self.count_score_tokens(r), 0, 1)) for r in requests]

    def count_prompt_tokens(self, messages: Sequence[Message]) -> int:
        return sum(len(m["content"].split()) + 2 for m in messages) + 1

    def count_score_tokens(self, request: ScoreRequest) -> int:
        return self.count_prompt_tokens(request.messages) + len(request.target.split()) + 1

    def count_tokens(self, text: str) -> int:
        return len(text.split(" "))

    def truncate_tokens(self, text: str, max_tokens: int, *, middle: bool = False) -> str:
        words = text.split(" ")
        if len(words) <= max_tokens:
            return text
        if not middle:
            return " ".join(words[:max_tokens])
        return " ".join(words[: max_tokens - max_tokens // 2] + words[len(words) - max_tokens // 2 :])

    @property
    def max_context(self) -> int:
        return self._max_context


class DictCorpus:
    def __init__(self, passages: Sequence[Passage]) -> None:
        self.passages = {p.id: p for p in passages}
        self.ids = list(self.passages)

    def get_many(self, ids: Sequence[str]) -> list[Passage]:
        return [self.passages[i] for i in ids]


class ScriptedRetriever:
    """Returns `pick(query, k)` ids and records every query it was asked."""

    def __init__(self, pick: Callable[[str, int], list[str]]) -> None:
        self.pick = pick
        self.queries: list[str] = []

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        hits = []
        for q in queries:
            hits.append([Hit(i, 1.0) for i in self.pick(q, k)])
            self.queries.append(q)
        return hits


def passage(i: int, words: int = 12) -> Passage:
    return Passage(f"p{i}", f"Title {i}", " ".join(f"w{i}x{j}" for j in range(words)))


QUESTION = Example("q1", "Who directed the film Blue Harbour?", ("Mara Velden",))


def run(strategy, lm, retriever, example: Example = QUESTION, **kw) -> dict:
    ctx = Context(lm, retriever, Meter())
    return Executor(lm, retriever).run([strategy(ctx, example, **kw)])[0]


def is_cot_request(r: GenerationRequest) -> bool:
    return r.stop == ("\n",) and r.messages[0]["content"].startswith(IRCOT_COT_INSTRUCTION)


def sentences_lm(sentences: Sequence[str], reader_answer: str = "Mara Velden") -> ScriptedLM:
    """Answers CoT requests with the scripted sentences in order (then nothing), readers with one answer."""
    queue = list(sentences)

    def reply(r: GenerationRequest) -> str:
        if is_cot_request(r):
            return queue.pop(0) if queue else ""
        return reader_answer

    return ScriptedLM(reply)


def test_text_helpers() -> None:
    assert (
        remove_wh_words("Who is the director of What Dreams May Come?")
        == "is the director of Dreams May Come?"
    )
    assert (
        first_sentence("  Blue Harbour was made in 3.5 days.  It won. ")
        == "Blue Harbour was made in 3.5 days."
    )
    assert first_sentence("no full stop here") == "no full stop here"
    for reasoning in (
        "So Mara is the director.",
        "Thus, it is X.",
        "Therefore X.",
        "Hence Y.",
        "That is, Z.",
        "It lasted 1,200 + 300 = 1,500 days.",
    ):
        assert is_reasoning_sentence(reasoning), reasoning
    for fact in ("Sonia was born in Soho.", "Thusnelda was a queen.", "Sofia is a city of 1,200 + people."):
        assert not is_reasoning_sentence(fact), fact
    assert extract_answer("So the answer is: Mara Velden.") == "Mara Velden"
    assert extract_answer("So the answer is U.S..") == "U.S."
    assert extract_answer("So the answer is: 3.5") == "3.5"
    assert extract_answer("Mara Velden directed it.") is None


def test_query_choice_skips_reasoning_sentences_and_wh_words() -> None:
    assert retrieval_query("Where is X?", []) == "is X?"
    assert retrieval_query("Where is X?", ["So it is Y."]) == "is X?"
    sentences = ["Blue Harbour was directed by Mara Velden.", "So Mara made it.", "It ran 2 + 3 = 5 weeks."]
    assert retrieval_query("q", sentences) == "Blue Harbour was directed by Mara Velden."
    assert retrieval_query("q", [*sentences, "Where was Mara Velden born is unknown."]) == (
        "was Mara Velden born is unknown."
    )

    corpus = DictCorpus([passage(i) for i in range(40)])
    retriever = ScriptedRetriever(lambda q, k: [f"p{len(retriever.queries) * k + j}" for j in range(k)])
    lm = sentences_lm(
        ["Mara Velden directed Blue Harbour.", "So Mara made it.", "Which city is Velden from?"]
    )
    record = run(ircot, lm, retriever, corpus=corpus, k=2, max_sentences=3)
    assert retriever.queries == [
        "directed the film Blue Harbour?",
        "Mara Velden directed Blue Harbour.",
        "Mara Velden directed Blue Harbour.",  # the reasoning sentence is not searched
        "city is Velden from?",
    ]
    assert record["queries"] == retriever.queries


def test_paragraph_cap_of_fifteen() -> None:
    corpus = DictCorpus([passage(i) for i in range(100)])
    retriever = ScriptedRetriever(lambda q, k: [f"p{len(retriever.queries) * k + j}" for j in range(k)])
    lm = sentences_lm([f"Fact number {i} holds." for i in range(10)])
    record = run(ircot, lm, retriever, corpus=corpus, k=4, max_sentences=8)
    assert len(retriever.queries) == 9  # the question, then one search per sentence
    assert len(record["doc_ids"]) == 36 and len(set(record["doc_ids"])) == 36
    assert record["context_doc_ids"] == [f"p{i}" for i in range(15)]
    reader = lm.requests[-1].messages[0]["content"]
    assert reader.count("Wikipedia Title:") == 15
    # every CoT prompt shows all paragraphs held so far, and never more than 15
    shown = [r.messages[0]["content"].count("Wikipedia Title:") for r in lm.requests if is_cot_request(r)]
    assert shown == [4, 8, 12, 15, 15, 15, 15, 15]


def test_duplicates_and_long_paragraphs_are_skipped() -> None:
    base = passage(1, words=30)
    same_text = Passage("copy", "Another Title", base.contents.upper().replace(" ", " , "))
    near = Passage("near", base.title, base.contents + " extra")
    different = passage(2, words=30)
    long_one = passage(3, words=601)
    just_fits = passage(4, words=600)
    assert is_near_duplicate(base, same_text) and is_near_duplicate(base, near)
    assert not is_near_duplicate(base, different)
    held = [base]
    added = add_paragraphs(held, [base, same_text, near, long_one, different, just_fits, different])
    assert [p.id for p in added] == ["p2", "p4"]

    corpus = DictCorpus([base, same_text, near, different, long_one, just_fits])
    retriever = ScriptedRetriever(lambda q, k: ["p1", "copy", "near", "p3"] if "Blue" in q else ["p2", "p1"])
    record = run(
        ircot, sentences_lm(["Velden lives in Oslo."]), retriever, corpus=corpus, k=4, max_sentences=1
    )
    assert record["context_doc_ids"] == ["p1", "p2"]
    assert record["doc_ids"] == ["p1", "copy", "near", "p3", "p2", "p1"]


def test_stops_at_the_answer_pattern_keeping_the_first_sentence() -> None:
    corpus = DictCorpus([passage(i) for i in range(10)])
    retriever = ScriptedRetriever(lambda q, k: ["p1"])
    lm = sentences_lm(
        [
            "Blue Harbour was directed by Mara Velden. So the answer is: Wrong.\nQ: another",
            "So the answer is: Mara Velden.",
            "This sentence is never asked for.",
        ]
    )
    record = run(ircot, lm, retriever, corpus=corpus, max_sentences=8)
    assert record["cot_sentences"] == [
        "Blue Harbour was directed by Mara Velden.",
        "So the answer is: Mara Velden.",
    ]
    assert record["cot_answer"] == "Mara Velden" and record["stop_reason"] == "answer"
    assert sum(is_cot_request(r) for r in lm.requests) == 2
    assert all(r.temperature == 0 for r in lm.requests)
    assert record["predictions"] == "Mara Velden"  # the reader's answer


def test_stops_on_empty_output_and_at_the_sentence_limit() -> None:
    corpus = DictCorpus([passage(i) for i in range(10)])
    retriever = ScriptedRetriever(lambda q, k: ["p1"])
    lm = sentences_lm(["One fact.", "   "])
    record = run(ircot, lm, retriever, corpus=corpus)
    assert record["stop_reason"] == "empty" and record["cot_sentences"] == ["One fact."]

    lm = sentences_lm([f"Fact {i}." for i in range(20)])
    record = run(ircot, lm, retriever, corpus=corpus, max_sentences=3)
    assert record["stop_reason"] == "max_sentences" and len(record["cot_sentences"]) == 3
    assert sum(is_cot_request(r) for r in lm.requests) == 3
    assert record["model_calls"] == 4 == len(record["calls"])


@pytest.mark.parametrize("reader", ["direct", "cot"])
def test_reader_never_sees_the_cot(reader: str) -> None:
    corpus = DictCorpus([passage(i) for i in range(10)])
    retriever = ScriptedRetriever(lambda q, k: [f"p{len(retriever.queries)}"])
    cot = ["Zorblax lives in Quuxville.", "Quuxville lies in Fremantia.", "So the answer is: Fremantia."]
    answer = "Fremantia" if reader == "direct" else "It is there. So the answer is: Fremantia."
    lm = sentences_lm(cot, reader_answer=answer)
    record = run(ircot, lm, retriever, corpus=corpus, reader=reader)
    assert record["cot"] == " ".join(cot)
    (read_request,) = [r for r in lm.requests if not is_cot_request(r)]
    assert [m["role"] for m in read_request.messages] == ["user"]
    content = read_request.messages[0]["content"]
    for word in ("Zorblax", "Quuxville", "Fremantia"):
        assert word not in content
    for doc_id in record["context_doc_ids"]:
        assert corpus.passages[doc_id].contents in content
    assert content.endswith(f"Q: {QUESTION.query}")
    # each CoT request continues the CoT so far as the assistant's reply
    cot_requests = [r for r in lm.requests if is_cot_request(r)]
    assert [m["role"] for m in cot_requests[0].messages] == ["user"]
    for i, request in enumerate(cot_requests[1:], start=1):
        assert request.messages[-1] == {"role": "assistant", "content": " ".join(cot[:i])}
    assert record["predictions"] == "Fremantia"


def demo(i: int) -> Demonstration:
    paragraphs = (
        DemoParagraph(f"Gold {i}", "gold text " * 20, True),
        DemoParagraph(f"Other {i}", "other text " * 20),
    )
    return Demonstration(
        f"Demo question {i}?", f"Answer{i}", f"Fact {i}. So the answer is: Answer{i}.", paragraphs
    )


def test_demonstrations_dropped_from_the_front_when_too_long() -> None:
    corpus = DictCorpus([passage(i) for i in range(10)])
    retriever = ScriptedRetriever(lambda q, k: ["p1"])
    demos = [demo(i) for i in range(15)]
    lm = sentences_lm(["So the answer is: X."])
    full = run(ircot, lm, retriever, corpus=corpus, demonstrations=demos)
    assert full["demonstrations_kept"] == [15]
    limit = lm.count_prompt_tokens(lm.requests[0].messages) // 2
    lm = sentences_lm(["So the answer is: X."])
    cut = run(ircot, lm, retriever, corpus=corpus, demonstrations=demos, max_prompt_tokens=limit)
    kept = cut["demonstrations_kept"][0]
    assert 0 < kept < 15
    messages = lm.requests[0].messages
    prompt = "\n".join(m["content"] for m in messages)
    assert lm.count_prompt_tokens(messages) <= limit
    assert "Demo question 14?" in prompt and "Demo question 0?" not in prompt
    assert f"Demo question {15 - kept}?" in prompt and f"Demo question {14 - kept}?" not in prompt
    # demonstrations are turns: the user's paragraphs and question, the assistant's CoT (or answer)
    assert [m["role"] for m in messages] == ["user", "assistant"] * kept + ["user"]
    assert messages[0]["content"].startswith(IRCOT_COT_INSTRUCTION)
    assert messages[-3]["content"].endswith("Q: Demo question 14?")
    assert messages[-2]["content"] == "Fact 14. So the answer is: Answer14."
    assert lm.requests[-1].messages[-2]["content"] == "Answer14"


def test_a_block_too_long_even_without_demonstrations_keeps_its_question() -> None:
    corpus = DictCorpus([passage(i, words=50) for i in range(20)])
    retriever = ScriptedRetriever(lambda q, k: [f"p{j}" for j in range(k)])
    lm = ScriptedLM(lambda r: "Fact one.", max_context=300)
    record = run(ircot, lm, retriever, corpus=corpus, k=10, max_sentences=1, demonstrations=[demo(0)])
    prompt = lm.requests[0].messages
    assert record["demonstrations_kept"] == [0]
    assert lm.count_prompt_tokens(prompt) <= 300 - 64
    assert prompt[0]["content"].endswith(f"Q: {QUESTION.query}")
    assert prompt[0]["content"].count("Wikipedia Title:") < 10


def test_baselines_one_step_and_no_retrieval() -> None:
    corpus = DictCorpus([passage(i) for i in range(20)])
    retriever = ScriptedRetriever(lambda q, k: [f"p{j}" for j in range(k)])
    lm = sentences_lm([])
    record = run(one_step, lm, retriever, corpus=corpus, k=7, demonstrations=[demo(0)])
    assert retriever.queries == ["directed the film Blue Harbour?"]
    assert record["doc_ids"] == [f"p{j}" for j in range(7)] == record["context_doc_ids"]
    assert sum(m["content"].count("Wikipedia Title:") for m in lm.requests[0].messages) == 7 + 2
    assert record["predictions"] == "Mara Velden" and record["model_calls"] == 1

    lm = sentences_lm([])
    record = run(no_retrieval, lm, None, demonstrations=[demo(0)])
    turns = [(m["role"], m["content"]) for m in lm.requests[0].messages]
    assert "Wikipedia Title:" not in "".join(c for _, c in turns)
    assert turns[0][1].endswith("\n\nQ: Demo question 0?") and turns[1] == ("assistant", "Answer0")
    assert turns[2] == ("user", f"Q: {QUESTION.query}")
    assert record["doc_ids"] == [] and record["tokens"] == lm.count_prompt_tokens(lm.requests[0].messages) + 3


def test_budget_stops_the_cot_but_keeps_room_for_the_reader() -> None:
    corpus = DictCorpus([passage(i) for i in range(20)])
    retriever = ScriptedRetriever(lambda q, k: [f"p{len(retriever.queries)}"])
    lm = sentences_lm([f"Fact {i}." for i in range(20)])
    ctx = Context(lm, retriever, Meter(budget=2000))
    record = Executor(lm, retriever).run(
        [ircot(ctx, QUESTION, corpus=corpus, max_sentences=20, reader_max_new_tokens=200)]
    )[0]
    assert record["stop_reason"] == "budget" and 0 < len(record["cot_sentences"]) < 20
    assert record["calls"][-1]["purpose"] == "reader:direct" and record["predictions"] == "Mara Velden"
    assert record["tokens"] <= 2000


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        ("Mara Velden", "Mara Velden"),
        ("A: Mara Velden", "Mara Velden"),
        ("A:\nMara Velden", "Mara Velden"),
        ("answer: Mara Velden.\nIt was her first film.", "Mara Velden."),
        (f"Q: {QUESTION.query}\nA: Mara Velden", "Mara Velden"),
    ],
)
def test_the_direct_reader_never_answers_just_the_marker(reply: str, answer: str) -> None:
    corpus = DictCorpus([passage(i) for i in range(10)])
    retriever = ScriptedRetriever(lambda q, k: ["p1"])
    for method, kw in ((ircot, {"max_sentences": 1}), (one_step, {}), (no_retrieval, {})):
        lm = sentences_lm(["Fact one."], reader_answer=reply)
        record = run(method, lm, retriever, corpus=corpus, **kw)
        assert record["predictions"] == answer and record["reader_output"] == reply.strip()
        assert record["answer_source"] == "format" and record["parse_failures"] == 0
        assert lm.requests[-1].stop == ()  # no stop string can cut the reply before its answer


def test_reader_replies_without_an_answer_are_counted() -> None:
    retriever = ScriptedRetriever(lambda q, k: ["p1"])
    record = run(no_retrieval, sentences_lm([], reader_answer="A:"), retriever)
    assert record["predictions"] == "" and record["answer_source"] == "none"
    assert record["parse_failures"] == 1
    # the CoT reader without "answer is:": its last sentence, counted as a fallback
    lm = sentences_lm([], reader_answer="A: Blue Harbour is a film. Its director is Mara Velden.")
    record = run(no_retrieval, lm, retriever, reader="cot")
    assert record["predictions"] == "Its director is Mara Velden"
    assert record["answer_source"] == "text" and record["parse_failures"] == 1
    lm = sentences_lm([], reader_answer="She directed it. So the answer is: Mara Velden.")
    record = run(no_retrieval, lm, retriever, reader="cot")
    assert record["predictions"] == "Mara Velden" and record["answer_source"] == "format"


def test_a_cot_sentence_loses_its_answer_marker() -> None:
    corpus = DictCorpus([passage(i) for i in range(10)])
    retriever = ScriptedRetriever(lambda q, k: ["p1"])
    lm = sentences_lm(
        ["A: Blue Harbour was directed by Mara Velden. More.", "A: So the answer is: Mara Velden."]
    )
    record = run(ircot, lm, retriever, corpus=corpus)
    assert record["cot_sentences"] == [
        "Blue Harbour was directed by Mara Velden.",
        "So the answer is: Mara Velden.",
    ]
    assert record["cot_answer"] == "Mara Velden"


def test_a_budget_too_small_for_any_call_is_no_parse_failure() -> None:
    corpus = DictCorpus([passage(i) for i in range(20)])
    retriever = ScriptedRetriever(lambda q, k: ["p1"])
    lm = sentences_lm(["Fact one."])
    ctx = Context(lm, retriever, Meter(budget=10))
    record = Executor(lm, retriever).run([ircot(ctx, QUESTION, corpus=corpus)])[0]
    assert record["calls"] == [] and record["predictions"] == ""
    assert record["answer_source"] == "none" and record["parse_failures"] == 0
