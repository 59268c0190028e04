"""Decoding strategies on the toy world with the tiny model through the transformers backend."""

from __future__ import annotations

import math

import pytest

from corag.chain import DecodeResult
from corag.decoding import STRATEGIES, best_of_n, get_strategy, greedy, tree_search
from corag.errors import InputError
from corag.executor import Executor
from corag.lm.base import ScoreRequest
from corag.prompts import PENALTY_TARGET, STOP_YES, parse_subquery, penalty_messages
from corag.types import Step

CALL_A = "You are using a search engine"
CALL_B = "Given the following documents"
CALL_C = "Given the following intermediate queries and answers, generate a final answer"
STOP = "judge whether they contain enough information"


def content(request) -> str:
    return request.messages[-1]["content"]


def run(
    lm, retriever, strategy, questions, corpus, max_active=256, budget=None, dedup=True, **kw
) -> list[DecodeResult]:
    ex = Executor(lm, retriever, max_active=max_active, dedup=dedup)
    return ex.run([strategy(ex.context(budget), q, corpus, **kw) for q in questions])


def summary(result: DecodeResult):
    return result.steps, result.prediction, result.usage, result.context_doc_ids


@pytest.fixture(scope="module")
def questions(toy_world):
    return toy_world.test[:6]


@pytest.fixture
def recording(short_lm, record):
    return record(short_lm)


def test_greedy_is_deterministic_and_independent_of_batching(short_lm, toy_retriever, toy_corpus, questions):
    questions = questions[:4]
    batched = run(short_lm, toy_retriever, greedy, questions, toy_corpus, max_steps=2)
    again = run(short_lm, toy_retriever, greedy, questions, toy_corpus, max_steps=2)
    one_by_one = run(short_lm, toy_retriever, greedy, questions, toy_corpus, max_active=1, max_steps=2)
    assert [summary(r) for r in batched] == [summary(r) for r in again] == [summary(r) for r in one_by_one]
    for q, r in zip(questions, batched, strict=True):
        assert r.query_id == q.id and 1 <= len(r.steps) <= 2
        assert r.context_doc_ids == tuple(h.doc_id for h in toy_retriever.search([q.query], 20)[0])
        for step in r.steps:  # each step holds the top-5 documents of its own sub-query
            assert step.doc_ids == tuple(h.doc_id for h in toy_retriever.search([step.subquery], 5)[0])
        assert len({s.subquery for s in r.steps}) == len(r.steps)  # repeats were discarded


def test_greedy_call_pattern_and_coalescing(recording, toy_retriever, toy_corpus, questions):
    max_steps = 2
    # every call as the strategy issues it (repeats are not served from earlier results)
    results = run(recording, toy_retriever, greedy, questions, toy_corpus, max_steps=max_steps, dedup=False)
    requests = [r for r, _ in recording.generated]
    subquery_calls = [r for r in requests if content(r).startswith(CALL_A)]
    # one final answer and one sub-answer per step; sub-query calls within 4L per question
    assert sum(content(r).startswith(CALL_C) for r in requests) == len(questions)
    assert sum(content(r).startswith(CALL_B) for r in requests) == sum(len(r.steps) for r in results)
    assert len(subquery_calls) <= 4 * max_steps * len(questions)
    assert all(r.temperature in (0.0, 0.7) and r.max_new_tokens == 64 for r in subquery_calls)
    assert all(r.temperature == 0.0 for r in requests if not content(r).startswith(CALL_A))
    assert sum(r.calls for r in results) == len(requests)
    assert recording.batches["generate"] < len(requests) / 2  # calls of many questions share batches


def test_zero_steps_answers_from_the_documents_alone(recording, toy_retriever, toy_corpus, questions):
    results = run(recording, toy_retriever, greedy, questions[:2], toy_corpus, max_steps=0)
    assert all(r.steps == () and r.calls == 1 for r in results)
    assert [content(r).startswith(CALL_C) for r, _ in recording.generated] == [True, True]
    assert "Doc 19: " in content(recording.generated[0][0])


def test_best_of_n_keeps_the_chain_with_the_lowest_recomputed_penalty(
    short_lm, recording, toy_retriever, toy_corpus, questions
):
    n = 3
    results = run(recording, toy_retriever, best_of_n, questions[:3], toy_corpus, max_steps=2, n=n)
    greedy_results = run(short_lm, toy_retriever, greedy, questions[:3], toy_corpus, max_steps=2)
    for q, r, g in zip(questions[:3], results, greedy_results, strict=True):
        chains = [[Step(s["subquery"], s["subanswer"]) for s in c] for c in r.extras["chains"]]
        assert len(chains) == n
        assert [(s.subquery, s.subanswer) for s in chains[0]] == [(s.subquery, s.subanswer) for s in g.steps]
        recomputed = [
            s.mean
            for s in short_lm.score(
                [
                    ScoreRequest(tuple(penalty_messages(q.query, c, tok=short_lm)), PENALTY_TARGET)
                    for c in chains
                ]
            )
        ]
        assert r.extras["penalties"] == pytest.approx(recomputed, abs=1e-4)
        best = min(range(n), key=lambda i: recomputed[i])
        assert [(s.subquery, s.subanswer) for s in r.steps] == [
            (s.subquery, s.subanswer) for s in chains[best]
        ]
    scored = [r for r, _ in recording.scored]
    assert len(scored) == n * 3 and all(r.target == PENALTY_TARGET for r in scored)


def test_tree_search_explores_as_specified(recording, toy_retriever, toy_corpus, questions):
    max_steps = 2
    (result,) = run(recording, toy_retriever, tree_search, questions[:1], toy_corpus, max_steps=max_steps)
    assert len(result.steps) == max_steps  # always L steps
    requests = [r for r, _ in recording.generated]
    expansions = [r for r in requests if content(r).startswith(CALL_A) and r.n == 6]
    assert len(expansions) == max_steps and all(r.temperature == 0.7 for r in expansions)
    tree = result.extras["tree"]
    expanded = [c for r, c in recording.generated if content(r).startswith(CALL_A) and r.n == 6]
    for level, completion in enumerate(expanded):  # de-duplicated, at most 4 kept, in sampling order
        distinct = list(dict.fromkeys(parse_subquery(t) for t in completion.texts))
        assert [c["subquery"] for c in tree[level]] == distinct[:4]
        best = min(tree[level], key=lambda c: c["score"])
        assert result.steps[level].subquery == best["subquery"]
    # scoring: 2 rollouts of at most 2 more steps per candidate, one penalty each; at the last step
    # nothing can follow, so each candidate is scored once
    penalties = [r for r, _ in recording.scored if r.target == PENALTY_TARGET]
    assert len(penalties) == 2 * len(tree[0]) + len(tree[1])
    rollout_queries = [r for r in requests if content(r).startswith(CALL_A) and r.n == 1]
    assert all(r.temperature == 0.7 for r in rollout_queries)
    assert 2 * len(tree[0]) <= len(rollout_queries) <= 2 * len(tree[0]) * 4
    # sub-answers: one per candidate, one per rollout step
    assert sum(content(r).startswith(CALL_B) for r in requests) <= len(tree[0]) + len(tree[1]) + len(
        rollout_queries
    )


@pytest.mark.parametrize("strategy", ["greedy", "tree_search"])
def test_learned_stop(recording, toy_retriever, toy_corpus, questions, strategy):
    fn = get_strategy(strategy)
    (eager,) = run(recording, toy_retriever, fn, questions[:1], toy_corpus, max_steps=3, stop_bias=1e9)
    asked = [r for r, _ in recording.scored if STOP in content(r)]
    assert len(eager.steps) == 1 and {r.target for r in asked} == {"Yes", "No"} and len(asked) == 2
    recording.scored.clear()
    (never,) = run(recording, toy_retriever, fn, questions[:1], toy_corpus, max_steps=3, stop_bias=-1e9)
    assert len(never.steps) == 3
    assert (
        sum(r.target == STOP_YES for r, _ in recording.scored if STOP in content(r)) == 2
    )  # not after the last


def test_bad_settings_are_clear_errors(short_lm, toy_retriever, toy_corpus, questions):
    with pytest.raises(InputError, match="unknown strategy"):
        get_strategy("beam")
    assert sorted(STRATEGIES) == ["best_of_n", "greedy", "tree_search"]
    for strategy, kw, field in [
        (greedy, {"max_steps": -1}, "max_steps"),
        (tree_search, {"max_steps": -2}, "max_steps"),
        (best_of_n, {"max_steps": 1, "n": 0}, "n"),
    ]:
        with pytest.raises(InputError) as info:
            run(short_lm, toy_retriever, strategy, questions[:1], toy_corpus, **kw)
        assert info.value.field == field


def test_prompts_longer_than_the_context_are_middle_truncated(
    short_model_dir, record, toy_retriever, toy_corpus, questions
):
    from corag.lm import load_lm

    small = record(load_lm(short_model_dir, backend="hf", device="cpu", max_context=400))
    (r,) = run(small, toy_retriever, greedy, questions[:1], toy_corpus, max_steps=1)
    final = [req for req, _ in small.generated if content(req).startswith(CALL_C)]
    assert final and all(
        small.count_prompt_tokens(q.messages) + q.max_new_tokens <= 400 for q, _ in small.generated
    )
    assert content(final[0]).endswith("do not explain yourself or output anything else.")  # kept the end

    tiny = load_lm(short_model_dir, backend="hf", device="cpu", max_context=120)
    with pytest.raises(InputError, match="context"):
        run(tiny, toy_retriever, greedy, questions[:1], toy_corpus, max_steps=1)


def test_tokenizer_without_chat_template_is_a_clear_error(short_model_dir, tmp_path):
    import shutil

    from corag.lm import load_lm

    folder = tmp_path / "no-template"
    shutil.copytree(short_model_dir, folder)
    for name in ("chat_template.jinja", "chat_template.json"):
        (folder / name).unlink(missing_ok=True)
    config = folder / "tokenizer_config.json"
    import json

    data = json.loads(config.read_text())
    data.pop("chat_template", None)
    config.write_text(json.dumps(data))
    with pytest.raises(InputError, match="chat template"):
        load_lm(folder, backend="hf", device="cpu")


def test_results_carry_the_official_prediction_fields(short_lm, toy_retriever, toy_corpus, questions):
    (r,) = run(short_lm, toy_retriever, greedy, questions[:1], toy_corpus, max_steps=1)
    record = r.to_record()
    for key in ("query", "answers", "query_id", "context_doc_ids", "subqueries", "subanswers", "predictions"):
        assert key in record
    assert record["usage"]["total_tokens"] == r.usage.total and record["model_calls"] == r.calls
    assert not math.isnan(r.usage.total)
