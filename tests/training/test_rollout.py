"""Rollouts for GRPO on chains (corag/training/rollout.py): the pairs a chain trains on, their masks,
rewards from metered chains and group advantages."""

from __future__ import annotations

import math
import statistics

import pytest
from transformers import AutoTokenizer

from corag.data.corpus import Corpus
from corag.errors import InputError
from corag.executor import Executor
from corag.lm import load_lm
from corag.metrics import answer_scores
from corag.retrieval.bm25 import BM25Retriever
from corag.training.grpo import pair_tokens
from corag.training.rollout import RolloutConfig, chain_pairs, chain_reward, group_advantages, rollout

G = 3


@pytest.fixture(scope="module")
def setup(short_model_dir, toy_world, toy_dir):
    lm = load_lm(short_model_dir, backend="hf", device="cpu")
    corpus = Corpus.load(toy_dir / "corpus.jsonl")
    return lm, corpus, BM25Retriever.from_passages(toy_world.passages), toy_world.train[:4]


def run(setup, key="step-0", temperature=0.7, **config):
    lm, corpus, retriever, questions = setup
    return rollout(
        Executor(lm, retriever),
        questions,
        corpus,
        RolloutConfig(max_chain_length=2, **config),
        group_size=G,
        temperature=temperature,
        key=key,
    )


@pytest.fixture(scope="module")
def groups(setup):
    return run(setup, token_cost=0.5)


def test_one_group_of_chains_per_question_in_order(groups, setup):
    questions = setup[3]
    assert [[c.result.query_id for c in g] for g in groups] == [[q.id] * G for q in questions]
    assert all(len({c.result.extras["chain"] for c in g}) == G for g in groups)


def test_every_generation_is_a_pair_with_its_chains_advantage(groups):
    for chain in (c for g in groups for c in g):
        steps = len(chain.result.steps)
        # call A for each step (and any sub-query asked again), call B for each step, then call C
        assert len(chain.trace) >= 2 * steps + 1
        final, _ = chain.trace[-1]  # call C is the last call, greedy with its own new-token cap
        assert (final.max_new_tokens, final.temperature) == (128, 0.0)
        pairs = chain_pairs(chain)
        texts = [c.texts[0].strip() for _, c in chain.trace]
        assert len(pairs) == sum(1 for t in texts if t)
        assert all(p["advantage"] == chain.advantage for p in pairs)
        assert [p["completion"][0]["content"] for p in pairs] == [t for t in texts if t]
        assert [p["prompt"] for p in pairs] == [
            list(r.messages) for (r, c) in chain.trace if c.texts[0].strip()
        ]
        answers = [p for p in pairs if p["call"] == len(chain.trace) - 1]
        if chain.result.prediction:
            assert answers[0]["completion"][0]["content"] == chain.result.prediction


def test_no_retrieved_text_carries_a_label(groups, setup, short_model_dir, toy_world):
    lm = setup[0]
    tokenizer = AutoTokenizer.from_pretrained(short_model_dir)
    passages = {p.id: p.contents for p in toy_world.passages}
    with_documents = 0
    for chain in (c for g in groups for c in g):
        retrieved = {passages[d] for step in chain.result.steps for d in step.doc_ids}
        for pair in chain_pairs(chain):
            prompt_ids, completion_ids = pair_tokens(tokenizer, pair)
            # the labelled tokens are the generated text and one end-of-turn token, nothing else
            assert tokenizer.decode(completion_ids[:-1]) == pair["completion"][0]["content"]
            assert completion_ids[-1] in lm.end_ids
            shown = [text for text in retrieved if text in pair["prompt"][-1]["content"]]
            assert all(text in tokenizer.decode(prompt_ids) for text in shown)
            with_documents += bool(shown)
    assert with_documents > 0  # sub-answer prompts hold their documents, and they are prompt tokens


def test_rewards_come_from_the_metered_chain(groups):
    for chain in (c for g in groups for c in g):
        result = chain.result
        metered = sum(c.usage.total for _, c in chain.trace)
        assert result.usage.total == metered > 0
        f1 = answer_scores(result.prediction, result.answers)["f1"]
        assert chain.reward == pytest.approx(f1 - 0.5 * metered / 1000)
        assert (
            chain_reward(result, RolloutConfig(reward="em"))
            == answer_scores(result.prediction, result.answers)["em"]
        )


def test_advantages_are_normalised_within_each_group(groups):
    for group in groups:
        rewards = [c.reward for c in group]
        mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
        for chain in group:
            assert chain.advantage == pytest.approx((chain.reward - mean) / (std + 1e-4))


def test_group_advantages_by_hand():
    a = group_advantages([1.0, 0.0, 0.0, 1.0])  # mean 0.5, unbiased std sqrt(1/3)
    high = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert a == pytest.approx([high, -high, -high, high])
    assert group_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
    assert group_advantages([2.0, 0.0], scale=False) == [1.0, -1.0]  # trl's scale_rewards "none"


def test_the_same_key_samples_the_same_chains_and_another_key_others(setup, groups):
    def chains(gs):
        return [[(c.result.steps, c.result.prediction) for c in g] for g in gs]

    again = run(setup, token_cost=0.5)
    assert chains(again) == chains(groups)
    other = run(setup, key="step-1", token_cost=0.5)
    assert chains(other) != chains(groups)


def test_loglik_reward_is_the_gold_answers_score_and_not_trained_on(setup):
    groups = run(setup, reward="loglik")
    for chain in (c for g in groups for c in g):
        assert chain.reward == chain.result.extras["gold_logprob"] < 0
        assert all(r.max_new_tokens > 0 for r, _ in chain.trace)  # generations only, no scoring call


def test_bad_settings_are_refused(setup):
    with pytest.raises(InputError, match="reward"):
        run(setup, reward="bleu")
    with pytest.raises(InputError, match="temperature"):
        run(setup, temperature=0.0)
    lm, corpus, retriever, questions = setup
    with pytest.raises(InputError, match="at least 2"):
        rollout(
            Executor(lm, retriever), questions, corpus, RolloutConfig(), group_size=1, temperature=1, key="k"
        )
