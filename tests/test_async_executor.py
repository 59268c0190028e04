"""The asyncio executor: the same results as the stepped executor, with a scripted LM for control flow
and with the tiny model on the transformers backend for real strategies."""

from __future__ import annotations

import asyncio

import pytest

from corag.async_executor import AsyncExecutor
from corag.budget import BudgetExceeded
from corag.decoding import STRATEGIES
from corag.executor import Context, Executor
from corag.lm import load_lm
from corag.retrieval.bm25 import BM25Retriever
from tests.test_executor import ScriptedLM, ScriptedRetriever, ask, repeated_calls, three_turns


async def fan_out(ctx: Context, i: int) -> list:
    hits = await ctx.search(f"q{i}", 2)
    texts = await ctx.gather(*(three_turns(ctx, 10 * i + j) for j in range(3)))
    return [hits, texts, ctx.meter.usage]


@pytest.mark.parametrize("program", [three_turns, fan_out, repeated_calls])
def test_same_results_as_the_stepped_executor(program):
    stepped = Executor(ScriptedLM(), ScriptedRetriever())
    want = stepped.run([program(stepped.context(), i) for i in range(7)])
    lm = ScriptedLM()
    ex = AsyncExecutor(lm, ScriptedRetriever(), max_active=3)
    assert ex.run([program(ex.context(), i) for i in range(7)]) == want
    assert len(lm.batches) < sum(len(b) for b in lm.batches)  # calls of several questions shared batches


class AsyncEngineLM(ScriptedLM):
    """A scripted LM with an asynchronous engine's interface; counts the batches in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = self.most_in_flight = 0

    async def _engine(self, call, requests):
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.05)  # decoding: other questions' calls arrive meanwhile
        self.in_flight -= 1
        return call(requests)

    async def agenerate(self, requests):
        return await self._engine(self.generate, requests)

    async def ascore(self, requests):
        return await self._engine(self.score, requests)


async def staggered(ctx: Context, i: int) -> list:
    """Question i searches i times first, so the questions reach the model at different times."""
    hits = [await ctx.search(f"q{i} s{j}", 1) for j in range(i)]
    return [hits, await three_turns(ctx, i), ctx.meter.usage]


@pytest.mark.parametrize("program", [three_turns, fan_out, repeated_calls, staggered])
def test_an_asynchronous_engine_takes_overlapping_batches_with_the_same_results(program):
    stepped = Executor(ScriptedLM(), ScriptedRetriever())
    want = stepped.run([program(stepped.context(), i) for i in range(7)])
    lm = AsyncEngineLM()
    ex = AsyncExecutor(lm, ScriptedRetriever(), max_active=4)
    assert ex.run([program(ex.context(), i) for i in range(7)]) == want
    if program is staggered:
        assert lm.most_in_flight > 1  # a batch was sent while another was still decoding


async def failing_child(ctx: Context, i: int) -> list:
    async def bad() -> None:
        await ctx.generate(ask("x"))
        raise ValueError(f"question {i} failed")

    return await ctx.gather(three_turns(ctx, i), bad())


def test_a_failure_cancels_siblings_and_ends_the_run():
    ex = AsyncExecutor(ScriptedLM())
    with pytest.raises(ValueError, match=r"question \d failed"):
        ex.run([failing_child(ex.context(), i) for i in range(3)])


async def over_budget(ctx: Context) -> str:
    try:
        await ctx.generate(ask("a b c d e f", n=50))
    except BudgetExceeded:
        return "refused"
    return "ran"


def test_budgets_are_checked_before_submitting():
    lm = ScriptedLM()
    ex = AsyncExecutor(lm)
    assert ex.run([over_budget(ex.context(budget=20)), over_budget(ex.context())]) == ["refused", "ran"]
    assert sum(len(b) for b in lm.batches) == 1


def test_greedy_predictions_equal_the_stepped_executor_on_the_tiny_model(
    short_model_dir, toy_world, tmp_path
):
    from corag.data.corpus import Corpus, write_corpus_jsonl

    write_corpus_jsonl(tmp_path / "corpus.jsonl", toy_world.passages)
    corpus = Corpus.load(tmp_path / "corpus.jsonl")
    lm = load_lm(short_model_dir, device="cpu", batch_size=32)
    retriever = BM25Retriever.from_passages(toy_world.passages)
    questions = toy_world.test[:6]
    results = []
    for executor in (Executor(lm, retriever), AsyncExecutor(lm, retriever)):
        runs = [STRATEGIES["greedy"](executor.context(), q, corpus, max_steps=2) for q in questions]
        results.append([(r.steps, r.prediction, r.usage) for r in executor.run(runs)])
    assert results[0] == results[1]


def test_stream_yields_every_question_once_and_raises_failures():
    stepped = Executor(ScriptedLM(), ScriptedRetriever())
    want = stepped.run([fan_out(stepped.context(), i) for i in range(5)])
    ex = AsyncExecutor(ScriptedLM(), ScriptedRetriever(), max_active=2)
    got = dict(ex.stream(fan_out(ex.context(), i) for i in range(5)))
    assert [got[i] for i in range(5)] == want
    with pytest.raises(ValueError, match="failed"):
        list(ex.stream([three_turns(ex.context(), 0), failing_child(ex.context(), 1)]))


def test_predict_with_the_async_executor_writes_the_stepped_predictions(
    short_model_dir, toy_dir, toy_world, tmp_path
):
    import json

    from corag.decoding.predict import main
    from corag.retrieval.bm25 import build_bm25_folder

    build_bm25_folder([toy_world.passages], tmp_path / "bm25")
    common = [
        "--model", str(short_model_dir), "--device", "cpu", "--data", str(toy_dir / "test.jsonl"),
        "--corpus", str(toy_dir / "corpus.jsonl"), "--index", str(tmp_path / "bm25"), "--limit", "4",
        "--strategy", "best_of_n", "--n", "2", "--max-steps", "2",
    ]  # fmt: skip
    runs = {}
    for executor in ("stepped", "async"):
        out = tmp_path / executor / "predictions.jsonl"
        assert main([*common, "--executor", executor, "--out", str(out)]) == 0
        records = [json.loads(line) for line in out.read_text().splitlines()]
        runs[executor] = sorted(
            ((r["query_id"], r["subqueries"], r["subanswers"], r["predictions"]) for r in records),
        )
    assert runs["async"] == runs["stepped"] and len(runs["async"]) == 4
