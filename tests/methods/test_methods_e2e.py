"""Every method end to end on toy questions: the real tiny model (HFLM), real BM25 over the toy world,
the real corpus, through the Executor. Records must be complete and their tokens metered exactly."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from corag.data.corpus import Corpus
from corag.executor import Context, Executor
from corag.lm.base import Completion, GenerationRequest, Score, ScoreRequest, WrappedLM
from corag.lm.hf import HFLM
from corag.methods import METHODS
from corag.methods.demos import demos_from_examples
from corag.methods.searchain import CONFIDENCE_THRESHOLD
from corag.prompts import IRCOT_COT_INSTRUCTION
from corag.retrieval.bm25 import BM25Retriever
from corag.types import Usage

CORE_FIELDS = {
    "query", "answers", "query_id", "context_doc_ids", "predictions", "strategy", "usage", "model_calls",
    "prediction", "doc_ids", "tokens", "calls",
}  # fmt: skip


class Recording(WrappedLM):
    """Delegates to the real LM and keeps every usage it reports (what the backend itself charged)."""

    def __init__(self, lm: HFLM) -> None:
        super().__init__(lm)
        self.usages: list[Usage] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = self.lm.generate(requests)
        self.usages += [c.usage for c in out]
        return out

    def score(self, requests: Sequence[ScoreRequest]) -> list[Score]:
        out = self.lm.score(requests)
        self.usages += [s.usage for s in out]
        return out


@pytest.fixture(scope="module")
def setup(toy_world, toy_dir: Path, tiny_model_dir: Path, tmp_path_factory):
    corpus = Corpus.load(toy_dir / "corpus.jsonl", cache_dir=tmp_path_factory.mktemp("corpus-cache"))
    retriever = BM25Retriever.from_passages(toy_world.passages)
    lm = HFLM(tiny_model_dir)
    demos = demos_from_examples(toy_world.train, corpus, n=2, retriever=retriever, seed=0)
    return corpus, retriever, lm, demos


SETTINGS = {
    "ircot": dict(k=2, max_sentences=2, sentence_max_new_tokens=8, reader_max_new_tokens=6),
    "one_step": dict(k=5, reader_max_new_tokens=6),
    "no_retrieval": dict(reader_max_new_tokens=6),
    "searchain": dict(max_rounds=2, chain_max_new_tokens=24, reader_max_new_tokens=6),
    "search-r1": dict(max_turns=2, max_new_tokens=8),
}


@pytest.mark.parametrize("method", sorted(SETTINGS))
def test_method_end_to_end(method: str, setup, toy_world) -> None:
    corpus, retriever, hf, demos = setup
    lm = Recording(hf)
    examples = toy_world.test[:3]
    settings = dict(SETTINGS[method])
    if method in ("ircot", "one_step", "no_retrieval"):
        settings["demonstrations"] = demos
    contexts = [Context(lm, retriever) for _ in examples]
    executor = Executor(lm, retriever)
    strategy = METHODS[method]
    records = executor.run(
        [strategy(c, e, corpus=corpus, **settings) for c, e in zip(contexts, examples, strict=True)]
    )
    corpus_ids = set(corpus.ids)
    for record, example, ctx in zip(records, examples, contexts, strict=True):
        assert CORE_FIELDS <= set(record)
        assert record["query_id"] == example.id and record["strategy"] == method
        assert isinstance(record["prediction"], str) and record["predictions"] == record["prediction"]
        assert record["tokens"] > 0 and record["tokens"] == ctx.meter.usage.total
        assert record["tokens"] == sum(c["prompt_tokens"] + c["completion_tokens"] for c in record["calls"])
        assert record["model_calls"] == len(record["calls"]) == ctx.meter.usage.calls
        assert set(record["doc_ids"]) <= corpus_ids and set(record["context_doc_ids"]) <= set(
            record["doc_ids"]
        )
        if method in ("ircot", "one_step"):
            assert record["doc_ids"] and record["context_doc_ids"]
    # what the backend charged is exactly what the records hold, and calls were batched across questions
    assert sum(u.total for u in lm.usages) == sum(r["tokens"] for r in records)
    assert executor.batches["generate"] < sum(len(r["calls"]) for r in records)
    if method == "ircot":
        reader_prompts = [c for r in records for c in r["calls"] if c["purpose"].startswith("reader")]
        assert len(reader_prompts) == len(examples)


class ScriptedChains(Recording):
    """The real model scores the reader's answers (the confidence); the Chain-of-Query and the reader's
    answers are scripted from the question's gold decomposition (round 1 leaves the last hop unsolved,
    round 2 answers it), because an untrained tiny model writes neither. Scripted calls are charged as
    the real tokenizer counts them."""

    def __init__(self, lm: HFLM, chains: dict[str, list[str]], answers: dict[str, str]) -> None:
        super().__init__(lm)
        self.chains, self.answers = chains, answers

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for r in requests:
            content = r.messages[-1]["content"]
            if content.startswith("Given the following"):
                text = self.answers[content.split("## Query\n")[1].split("\n")[0]]
            else:
                question = r.messages[2]["content"].rsplit("Question: ", 1)[1]  # after the example
                text = self.chains[question][sum(m["role"] == "assistant" for m in r.messages[3:])]
            usage = Usage(self.lm.count_prompt_tokens(r.messages), self.lm.count_tokens(text) + 1, 1)
            out.append(Completion((text,), usage))
        self.usages += [c.usage for c in out]
        return out


def test_searchain_with_real_reader_and_retrieval(setup, toy_world) -> None:
    corpus, retriever, hf, _ = setup
    examples = [e for e in toy_world.test if len(e.decomposition) == 2][:2]
    chains, answers = {}, {}
    for e in examples:
        (q1, a1), (q2, a2) = [(s.subquery, s.subanswer) for s in e.decomposition]
        answers |= {q1: f"not {a1}", q2: a2}  # the reader disagrees with node 1, but is not confident
        first = f"[Query 1]: {q1}\n[Answer 1]: {a1}\n[Query 2]: {q2}\n[Unsolved Query]: {q2}\n"
        second = f"[Query 1]: {q1}\n[Answer 1]: {a1}\n[Query 2]: {q2}\n[Answer 2]: {a2}\n"
        final = f"[Final Content]: It is {a2} [1] [2]. So the answer is: {a2}."
        chains[e.query] = [first + final, second + final]
    lm = ScriptedChains(hf, chains, answers)
    contexts = [Context(lm, retriever) for _ in examples]
    records = Executor(lm, retriever).run(
        [
            METHODS["searchain"](c, e, corpus=corpus, reader_max_new_tokens=6)
            for c, e in zip(contexts, examples, strict=True)
        ]
    )
    for record, example in zip(records, examples, strict=True):
        feedback = record["rounds"][0]["feedback"]
        assert feedback["node"] == 2 and feedback["unsolved"]  # an unsolved node is always sent back
        assert feedback["answer"] == example.answers[0]
        # a real mean log-probability from the tiny model: far below the threshold
        assert -math.inf < feedback["confidence"] < CONFIDENCE_THRESHOLD
        assert record["passed"] and len(record["rounds"]) == 2
        assert record["predictions"] == example.answers[0]
        # BM25's top-1 document for each gold sub-query; the trace points at those documents
        top1 = [retriever.search([s.subquery], 1)[0][0].doc_id for s in example.decomposition]
        assert record["doc_ids"] == top1
        assert [(t["marker"], t["doc_id"]) for t in record["trace"]] == [(1, top1[0]), (2, top1[1])]
        assert (
            record["tokens"] == sum(c["prompt_tokens"] + c["completion_tokens"] for c in record["calls"]) > 0
        )
        purposes = [c["purpose"] for c in record["calls"]]
        assert purposes.count("chain") == 2 and purposes.count("reader") == purposes.count("confidence") == 2
    assert sum(u.total for u in lm.usages) == sum(r["tokens"] for r in records)


class ScriptedCoT(Recording):
    """The real model reads; the CoT sentences are scripted from each question's gold decomposition
    (an untrained tiny model writes none), charged as the real tokenizer counts them."""

    def __init__(self, lm: HFLM, cots: dict[str, list[str]]) -> None:
        super().__init__(lm)
        self.cots = cots

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out: list[Completion | None] = [None] * len(requests)
        cot = [
            i for i, r in enumerate(requests) if r.messages[0]["content"].startswith(IRCOT_COT_INSTRUCTION)
        ]
        readers = [i for i in range(len(requests)) if i not in cot]
        for i, completion in zip(readers, self.lm.generate([requests[i] for i in readers]), strict=True):
            out[i] = completion
        for i in cot:
            messages = requests[i].messages
            so_far = messages[-1]["content"] if messages[-1]["role"] == "assistant" else ""
            question = next(m for m in reversed(messages) if m["role"] == "user")["content"]
            question = question.rsplit("Q: ", 1)[1]
            sentences = self.cots[question]
            text = sentences[len([s for s in sentences if s in so_far])]
            usage = Usage(
                self.lm.count_prompt_tokens(requests[i].messages), self.lm.count_tokens(text) + 1, 1
            )
            out[i] = Completion((text,), usage)
        self.usages += [c.usage for c in out if c is not None]
        return [c for c in out if c is not None]


def test_ircot_sentences_retrieve_the_gold_paragraphs(setup, toy_world) -> None:
    from corag.methods.demos import chain_cot

    corpus, retriever, hf, demos = setup
    examples = [e for e in toy_world.test if len(e.decomposition) >= 2][:3]
    cots = {}
    for e in examples:
        cot = chain_cot([(s.subquery, s.subanswer) for s in e.decomposition], e.answers[0])
        cots[e.query] = [s if s.endswith(".") else s + "." for s in cot.split(". ")]
    lm = ScriptedCoT(hf, cots)
    contexts = [Context(lm, retriever) for _ in examples]
    records = Executor(lm, retriever).run(
        [
            METHODS["ircot"](c, e, corpus=corpus, demonstrations=demos, k=3, reader_max_new_tokens=6)
            for c, e in zip(contexts, examples, strict=True)
        ]
    )
    for record, example in zip(records, examples, strict=True):
        assert record["stop_reason"] == "answer" and record["cot_answer"] == example.answers[0]
        assert record["cot_sentences"] == cots[example.query]
        assert record["queries"][1:-1] == cots[example.query][:-1]  # each fact sentence was searched
        assert set(example.supporting_ids) <= set(record["context_doc_ids"])
        assert (
            record["tokens"] == sum(c["prompt_tokens"] + c["completion_tokens"] for c in record["calls"]) > 0
        )
    assert sum(u.total for u in lm.usages) == sum(r["tokens"] for r in records)
