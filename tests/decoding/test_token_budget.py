"""Token budgets: over random strategies, chain lengths, N and budgets, no question ever consumes more
than its budget, and what is metered equals the tokenizer's own count of everything sent."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corag.chain import final_cost
from corag.decoding import STRATEGIES
from corag.executor import Executor
from corag.prompts import STOP_NO

FINAL_CALL = "Given the following intermediate queries and answers, generate a final answer"


def recount_prompt(tokenizer, request) -> int:
    """Tokens of a generation prompt, rendered independently with the chat template."""
    text = tokenizer.apply_chat_template(list(request.messages), add_generation_prompt=True, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def recount_scored(tokenizer, request) -> int:
    """Tokens of prompt, target and its end-of-turn token, rendered independently."""
    text = tokenizer.apply_chat_template(list(request.messages), add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text + request.target, add_special_tokens=False)["input_ids"]
    return len(ids) + 1  # the end-of-turn token closing the assistant turn


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    strategy=st.sampled_from(sorted(STRATEGIES)),
    max_steps=st.integers(0, 2),
    n=st.integers(1, 3),
    budgets=st.lists(st.one_of(st.none(), st.integers(100, 8000)), min_size=2, max_size=2),
    stop_bias=st.sampled_from([None, 0.0]),
    first=st.integers(0, 20),
)
def test_budgets_hold_and_metering_matches_the_tokenizer(
    short_lm, record, toy_world, toy_retriever, toy_corpus, strategy, max_steps, n, budgets, stop_bias, first
):
    lm = record(short_lm)
    tokenizer = short_lm.tokenizer
    questions = toy_world.test[first : first + 2]
    kw = {"max_steps": max_steps, "stop_bias": stop_bias} | ({"n": n} if strategy == "best_of_n" else {})
    ex = Executor(lm, toy_retriever, dedup=False)  # every metered call reaches the recording LM
    contexts = [ex.context(b) for b in budgets]
    results = ex.run(
        [STRATEGIES[strategy](c, q, toy_corpus, **kw) for c, q in zip(contexts, questions, strict=True)]
    )
    for result, ctx, budget in zip(results, contexts, budgets, strict=True):
        assert result.usage == ctx.meter.usage
        if budget is not None:
            assert result.usage.total <= budget
        if "final_skipped" in result.extras:  # only when not even the bare final answer ever fit
            passages = toy_corpus.get_many(result.context_doc_ids)
            bare = final_cost(short_lm, result.query, (), "answer multi-hop questions", passages)
            assert budget is not None and budget < bare and result.usage.total == 0
    finals = [r for r, _ in lm.generated if r.messages[-1]["content"].startswith(FINAL_CALL)]
    assert len(finals) == sum("final_skipped" not in r.extras for r in results)  # the reserve kept room
    prompt = sum(recount_prompt(tokenizer, r) for r, _ in lm.generated)  # once per call, n samples or not
    prompt += sum(recount_scored(tokenizer, r) for r, _ in lm.scored)
    # a stop decision scores Yes and No in one call, its prompt charged once (corag.chain.stop_scores)
    stops = [r for r, _ in lm.scored if r.target == STOP_NO]
    prompt -= sum(recount_prompt(tokenizer, r) for r in stops)
    generated = sum(c.usage.completion_tokens for _, c in lm.generated)
    for r, c in lm.generated:  # generated tokens: each sample at least its end token, at most the limit
        assert r.n <= c.usage.completion_tokens <= r.n * r.max_new_tokens
        assert c.usage.prompt_tokens == recount_prompt(tokenizer, r)
    assert sum(ctx.meter.usage.prompt_tokens for ctx in contexts) == prompt
    assert sum(ctx.meter.usage.completion_tokens for ctx in contexts) == generated
    assert sum(ctx.meter.usage.calls for ctx in contexts) == len(lm.generated) + len(lm.scored) - len(stops)
    assert all(ctx.meter.pending == 0 for ctx in contexts)
