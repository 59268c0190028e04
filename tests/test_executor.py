"""Executor control flow with a scripted LM: coalescing, gather order, errors, cancellation, budgets."""

from __future__ import annotations

import asyncio

import pytest

from corag.budget import BudgetExceeded
from corag.decoding import STRATEGIES
from corag.executor import AsyncExecutor, Context, Executor
from corag.lm import load_lm
from corag.lm.base import Completion, GenerationRequest, Score, ScoreRequest
from corag.retrieval.bm25 import BM25Retriever
from corag.types import Hit, Usage


def words(messages) -> int:
    return sum(len(m["content"].split()) for m in messages)


class ScriptedLM:
    """Echoes the prompt; one token per word. Records every batch it receives."""

    max_context = 10_000

    def __init__(self) -> None:
        self.batches: list[list] = []

    def generate(self, requests):
        self.batches.append(list(requests))
        return [
            Completion(
                tuple(f"re {r.messages[-1]['content']}" for _ in range(r.n)),
                Usage(words(r.messages), r.n * 2, 1),
            )
            for r in requests
        ]

    def score(self, requests):
        self.batches.append(list(requests))
        return [
            Score((-1.0 / r.temperature, -2.0), Usage(self.count_score_tokens(r), 0, 1)) for r in requests
        ]

    def count_prompt_tokens(self, messages):
        return words(messages)

    def count_score_tokens(self, request: ScoreRequest):
        return words(request.messages) + len(request.target.split()) + 1

    def count_tokens(self, text):
        return len(text.split())

    def truncate_tokens(self, text, max_tokens, *, middle=False):
        return " ".join(text.split()[:max_tokens])


class ScriptedRetriever:
    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    def search(self, queries, k):
        self.calls.append((list(queries), k))
        return [[Hit(f"{q}-{i}", float(-i)) for i in range(10)] for q in queries]


def ask(text: str, n: int = 1) -> GenerationRequest:
    return GenerationRequest(({"role": "user", "content": text},), max_new_tokens=2, n=n)


async def three_turns(ctx: Context, i: int) -> list[str]:
    out = []
    for turn in range(3):
        completion = await ctx.generate(ask(f"q{i} t{turn}"))
        out.append(completion.texts[0])
    return out


def test_calls_of_many_questions_coalesce_into_few_backend_calls():
    lm = ScriptedLM()
    ex = Executor(lm)
    results = ex.run([three_turns(ex.context(), i) for i in range(40)])
    assert results[7] == ["re q7 t0", "re q7 t1", "re q7 t2"]
    assert ex.batches["generate"] == 3 == len(lm.batches)
    assert [len(b) for b in lm.batches] == [40, 40, 40]


def test_max_active_bounds_questions_in_flight_and_one_runs_sequentially():
    lm = ScriptedLM()
    ex = Executor(lm, max_active=7)
    ex.run([three_turns(ex.context(), i) for i in range(20)])
    assert max(len(b) for b in lm.batches) == 7
    lm1 = ScriptedLM()
    one = Executor(lm1, max_active=1)
    assert one.run([three_turns(one.context(), i) for i in range(5)]) == ex.run(
        [three_turns(ex.context(), i) for i in range(5)]
    )
    assert all(len(b) == 1 for b in lm1.batches) and len(lm1.batches) == 15


def test_searches_batch_at_the_largest_k_and_each_keeps_its_own():
    ret = ScriptedRetriever()
    ex = Executor(ScriptedLM(), ret)

    async def find(ctx: Context, k: int):
        return await ctx.search(f"q{k}", k)

    hits = ex.run([find(ex.context(), k) for k in (1, 5, 3)])
    assert [len(h) for h in hits] == [1, 5, 3]
    assert ret.calls == [(["q1", "q5", "q3"], 5)]


def test_gather_returns_results_in_argument_order_and_batches_children():
    lm = ScriptedLM()
    ex = Executor(lm)

    async def slow(ctx: Context, name: str, turns: int) -> str:
        text = name
        for _ in range(turns):
            text = (await ctx.generate(ask(text))).texts[0]
        return text

    async def question(ctx: Context) -> list[str]:
        return await ctx.gather(slow(ctx, "a", 3), slow(ctx, "b", 1), slow(ctx, "c", 2))

    assert ex.run([question(ex.context())]) == [["re re re a", "re b", "re re c"]]
    assert [len(b) for b in lm.batches] == [3, 2, 1]


def test_nested_gathers():
    ex = Executor(ScriptedLM())

    async def leaf(ctx, x):
        return (await ctx.generate(ask(x))).texts[0]

    async def inner(ctx, x):
        return await ctx.gather(leaf(ctx, x + "1"), leaf(ctx, x + "2"))

    async def outer(ctx):
        return await ctx.gather(inner(ctx, "a"), inner(ctx, "b"), leaf(ctx, "c"))

    assert ex.run([outer(ex.context())]) == [[["re a1", "re a2"], ["re b1", "re b2"], "re c"]]
    assert ex.run([outer(ex.context()) for _ in range(0)]) == []


def test_exception_in_a_strategy_propagates_out_of_the_run():
    ex = Executor(ScriptedLM())

    async def broken(ctx):
        await ctx.generate(ask("x"))
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        ex.run([three_turns(ex.context(), 0), broken(ex.context())])


def test_exception_in_gather_reaches_the_gather_and_cancels_siblings():
    lm = ScriptedLM()
    ex = Executor(lm)
    ctx = ex.context(budget=10_000)

    async def fails(ctx):
        await ctx.generate(ask("f"))
        raise ValueError("child failed")

    async def long(ctx):
        for i in range(5):
            await ctx.generate(ask(f"long {i}"))
        return "never"

    async def question(ctx):
        try:
            await ctx.gather(long(ctx), fails(ctx))
        except ValueError as exc:
            after = (await ctx.generate(ask("after"))).texts[0]
            return str(exc), after

    assert ex.run([question(ctx)]) == [("child failed", "re after")]
    sent = [r.messages[0]["content"] for batch in lm.batches for r in batch]
    assert "long 1" not in sent  # the sibling was cancelled after the failure
    assert ctx.meter.pending == 0
    assert ctx.meter.usage.calls == 3


def test_awaiting_anything_else_is_a_clear_error():
    ex = Executor(ScriptedLM())

    async def sleeps(ctx):
        await asyncio.sleep(0)

    with pytest.raises(TypeError, match="ctx calls"):
        ex.run([sleeps(ex.context())])


def test_stream_yields_questions_as_they_finish():
    ex = Executor(ScriptedLM())

    async def turns(ctx, n):
        for _ in range(n):
            await ctx.generate(ask("x"))
        return n

    order = [i for i, _ in ex.stream(turns(ex.context(), n) for n in (3, 1, 2))]
    assert order == [1, 2, 0]


def test_context_refuses_calls_that_could_pass_the_budget():
    lm = ScriptedLM()
    ex = Executor(lm)
    ctx = ex.context(budget=10)  # each call: 3 prompt words + 2 new tokens = worst case 5

    async def question(ctx):
        done = 0
        try:
            while True:
                await ctx.generate(ask("a b c"))
                done += 1
        except BudgetExceeded:
            return done

    assert ex.run([question(ctx)]) == [2]
    assert ctx.meter.usage == Usage(6, 4, 2)


def test_concurrent_calls_of_one_question_cannot_together_pass_the_budget():
    lm = ScriptedLM()
    ex = Executor(lm)
    ctx = ex.context(budget=12)

    async def one(ctx):
        try:
            return (await ctx.generate(ask("a b c"))).texts[0]
        except BudgetExceeded:
            return None

    async def question(ctx):
        return await ctx.gather(*(one(ctx) for _ in range(4)))

    assert ex.run([question(ctx)]) == [["re a b c", "re a b c", None, None]]
    assert ctx.meter.usage.total == 10 <= 12


def test_a_call_with_n_samples_charges_its_prompt_once():
    lm = ScriptedLM()
    ex = Executor(lm)
    ctx = ex.context(budget=9)  # 3 prompt words + 3 samples x 2 new tokens = 9, the prompt counted once

    async def question(ctx):
        return (await ctx.generate(ask("a b c", n=3))).texts

    assert ex.run([question(ctx)]) == [("re a b c",) * 3]
    assert ctx.meter.usage == Usage(3, 6, 1)
    tight = ex.context(budget=8)
    with pytest.raises(BudgetExceeded):
        ex.run([question(tight)])


async def repeated_calls(ctx: Context, i: int) -> list:
    """Greedy and seeded generations, scorings and searches that repeat across questions and steps,
    and unseeded sampling, which must never be reused."""
    out = []
    for turn in range(2):
        out.append((await ctx.generate(ask(f"shared t{turn}"))).texts)
        sampled = GenerationRequest(({"role": "user", "content": "s"},), max_new_tokens=2, temperature=1.0)
        out.append((await ctx.generate(sampled)).usage)
        seeded = GenerationRequest(({"role": "user", "content": "s"},), temperature=1.0, seed=turn)
        out.append((await ctx.generate(seeded)).texts)
        out.append((await ctx.score(ScoreRequest(({"role": "user", "content": "q"},), "a b"))).logprobs)
        out.append((await ctx.score(ScoreRequest(({"role": "user", "content": "q"},), "a b", 0.5))).logprobs)
        out.append(await ctx.search(f"query {i % 2}", 3))
    out.append(ctx.meter.usage)
    return out


def test_identical_requests_are_computed_once_with_identical_results():
    runs = {}
    for dedup in (False, True):
        lm, ret = ScriptedLM(), ScriptedRetriever()
        ex = Executor(lm, ret, dedup=dedup)
        runs[dedup] = (ex.run([repeated_calls(ex.context(), i) for i in range(6)]), lm, ret, ex)
    (plain, lm0, ret0, ex0), (reused, lm1, ret1, ex1) = runs[False], runs[True]
    assert reused == plain  # the same texts, scores, hits and metered usage per question
    sent = [r for batch in lm1.batches for r in batch]
    unseeded = [r for r in sent if isinstance(r, GenerationRequest) and r.temperature > 0 and r.seed is None]
    assert len(unseeded) == 12  # every unseeded sampling call went to the backend
    # per turn: one greedy, one seeded, two scorings (at two temperatures: two results); the second
    # turn's scorings repeat the first's
    assert len(sent) - len(unseeded) == 2 + 2 + 2
    assert len([r for b in lm0.batches for r in b]) == 6 * 2 * 5
    assert [len(q) for q, _ in ret1.calls] == [2, 2] and [len(q) for q, _ in ret0.calls] == [6, 6]
    stats = ex1.dedup_stats
    assert stats["reused_calls"] == 6 * 2 * 5 - len(sent)
    assert 0 < stats["saved_prompt_tokens"] < stats["prompt_tokens"]
    assert ex0.dedup_stats["saved_prompt_tokens"] == 0


def test_reuse_cache_is_bounded():
    lm = ScriptedLM()
    ex = Executor(lm, cache_size=3)
    ex.run([three_turns(ex.context(), i) for i in range(3)])
    assert len(ex.batcher._cache) == 3  # the last turn of each question
    ex.run([three_turns(ex.context(), 2)])  # only its last turn is still cached
    assert len([r for b in lm.batches for r in b]) == 9 + 2


# The asyncio executor: the same results as the stepped one, with the scripted LM for control flow
# and with the tiny model on the transformers backend for real strategies.


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

    from corag.commands.predict import main
    from corag.retrieval.bm25 import build_bm25_folder

    build_bm25_folder([toy_world.passages], tmp_path / "bm25")
    common = [
        "--model", str(short_model_dir), "--device", "cpu", "--data", str(toy_dir / "test.jsonl"),
        "--corpus", str(toy_dir / "corpus.jsonl"), "--retriever", str(tmp_path / "bm25"), "--limit", "4",
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
