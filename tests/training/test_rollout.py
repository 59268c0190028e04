"""Rollouts for GRPO on chains (corag/training/rollout.py): the rows a chain trains on (the sampler's own
ids and log-probabilities), greedy calls out of the loss, the policy's stop decision, rewards from
metered chains and group advantages."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from corag.data.corpus import Corpus
from corag.errors import InputError
from corag.executor import Executor
from corag.lm import load_lm
from corag.lm.base import WrappedLM
from corag.metrics import answer_scores
from corag.retrieval.bm25 import BM25Retriever
from corag.training.rewards import parse_terms, total_reward
from corag.training.rollout import RolloutConfig, chain_rows, group_advantages, rollout, zero_spread

G = 3
T = 0.9


@pytest.fixture(scope="module")
def setup(short_model_dir, toy_world, toy_dir):
    lm = load_lm(short_model_dir, backend="hf", device="cpu")
    corpus = Corpus.load(toy_dir / "corpus.jsonl")
    return lm, corpus, BM25Retriever.from_passages(toy_world.passages), toy_world.train[:4]


def run(setup, key="step-0", temperature=T, lm=None, **config):
    default_lm, corpus, retriever, questions = setup
    return rollout(
        Executor(lm or default_lm, retriever),
        questions,
        corpus,
        RolloutConfig(**{"max_chain_length": 2, **config}),
        group_size=G,
        temperature=temperature,
        key=key,
    )


@pytest.fixture(scope="module")
def groups(setup):
    return run(setup, reward=["f1", "-0.5*tokens"])


def test_one_group_of_chains_per_question_in_order(groups, setup):
    questions = setup[3]
    assert [[c.result.query_id for c in g] for g in groups] == [[q.id] * G for q in questions]
    assert all(len({c.result.extras["chain"] for c in g}) == G for g in groups)


def test_every_call_is_sampled_and_every_row_is_exactly_what_the_sampler_drew(groups, setup, short_model_dir):
    """Each row's ids are the ids the sampler drew, and its log-probabilities are the policy's own at the
    rollout temperature (the stop decision's at the model's own, 1): a training forward pass over
    prompt + ids gives them back."""
    model = AutoModelForCausalLM.from_pretrained(short_model_dir).eval()
    lm = setup[0]
    checked = 0
    for chain in (c for g in groups for c in g):
        assert chain.calls[0] == "subquery" and chain.calls[-1] == "final"
        heat = [1.0 if kind == "stop" else T for kind in chain.calls]
        assert [request.temperature for request, _ in chain.trace] == heat
        rows = chain_rows(chain)
        samples = [s for _, completion in chain.trace for s in completion.samples]
        assert len(rows) == len(chain.trace) == len(samples)
        for row, (request, completion) in zip(rows, chain.trace, strict=True):
            (sample,) = completion.samples
            assert row["completion_ids"] == sample.token_ids and row["logprobs"] == sample.logprobs
            assert row["prompt_ids"] == lm.renderer.prompt_ids(request.messages)
            assert row["advantage"] == chain.advantage
            text = lm.tokenizer.decode(
                [i for i in row["completion_ids"] if i not in lm.end_ids], skip_special_tokens=True
            )
            assert text.startswith(completion.texts[0])  # the text is cut from the ids, never the reverse
        for row, t in list(zip(rows, heat, strict=True))[:3]:  # a forward pass per row: a few suffice
            ids = torch.tensor([row["prompt_ids"] + row["completion_ids"]])
            with torch.no_grad():
                logits = model(ids).logits[0, len(row["prompt_ids"]) - 1 : -1] / t
            expected = logits.log_softmax(-1).gather(-1, ids[0, len(row["prompt_ids"]) :, None])[:, 0]
            assert torch.allclose(torch.tensor(row["logprobs"]), expected, atol=1e-4)
            checked += 1
    assert checked > 0


def test_a_greedy_call_stays_in_the_chain_but_gives_no_row(setup):
    groups = run(setup, sampled_calls=["subquery", "stop"])
    for chain in (c for g in groups for c in g):
        greedy = [
            kind
            for (request, _), kind in zip(chain.trace, chain.calls, strict=True)
            if request.temperature == 0
        ]
        assert set(greedy) == {"subanswer", "final"} and len(greedy) == len(chain.result.steps) + 1
        rows = chain_rows(chain)
        assert {row["call"] for row in rows} <= {"subquery", "stop"}
        assert len(rows) == len(chain.trace) - len(greedy)


class EvenStopOdds(WrappedLM):
    """The tiny model, except that its Yes and No turns to the stop question are equally likely (a
    control-flow stand-in for a policy unsure when to stop): each decision stops with probability 1/2."""

    def score(self, requests):
        return [
            replace(s, logprobs=(0.0,) * (len(s.logprobs) - 1) + (-0.7,)) if is_stop(r) else s
            for r, s in zip(requests, self.lm.score(requests), strict=True)
        ]


def is_stop(request) -> bool:
    return "enough information" in request.messages[-1]["content"]


def test_the_policy_chooses_its_depth(setup):
    groups = run(setup, lm=EvenStopOdds(setup[0]), max_chain_length=3)
    lengths = [[len(c.result.steps) for c in g] for g in groups]
    assert any(len(set(group)) > 1 for group in lengths)  # chains of one group end at different depths
    for chain in (c for g in groups for c in g):
        stops = [kind for kind in chain.calls if kind == "stop"]
        assert len(stops) == min(len(chain.result.steps), 2)  # asked after each step but the last
        if len(chain.result.steps) < 3:
            assert chain.stopped
        decisions = [
            c.texts[0] for (_, c), kind in zip(chain.trace, chain.calls, strict=True) if kind == "stop"
        ]
        assert "Yes" not in decisions[:-1]  # a Yes ends the chain there
        if decisions[-1:] == ["Yes"]:
            assert chain.stopped and len(chain.result.steps) == len(decisions)
    fixed = run(setup, lm=EvenStopOdds(setup[0]), max_chain_length=3, learned_stop=False)
    assert all("stop" not in c.calls for g in fixed for c in g)


class RepeatsAtStepTwo(WrappedLM):
    """The tiny model, except that the sub-query asks whose seed is in `seeds` repeat the chain's first
    sub-query (a control-flow stand-in for a policy that asks the same thing twice)."""

    def __init__(self, lm, seeds):
        super().__init__(lm)
        self.seeds, self.asks = set(seeds), []

    def generate(self, requests):
        out = self.lm.generate(requests)
        for i, request in enumerate(requests):
            content = request.messages[-1]["content"]
            if "follow-up question" in content:
                self.asks.append(request)
                if request.seed in self.seeds:
                    first = re.search(r"Intermediate query 1: (.*)", content).group(1)
                    out[i] = replace(out[i], texts=(first,))
        return out


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_rollout_grows_its_chain_by_greedy_decodings_rule(setup, temperature):
    """The same question, chain label and temperature: a rollout and evaluation's chain loop
    (corag.decoding.greedy.sample_chain, as greedy and best-of-N run it, learned stop at bias 0) take the
    same steps, ask a repeated sub-query again the same way, and take the same stop decisions."""
    from corag.chain import call_seed, open_question
    from corag.decoding.greedy import sample_chain
    from corag.training.rollout import rollout_chain

    lm, corpus, retriever, questions = setup
    example = questions[0]
    repeat = call_seed(example.id, "7", 1, 2)  # step 2's first ask
    sampled = ["subquery"] if temperature else []
    config = RolloutConfig(max_chain_length=3, sampled_calls=sampled, learned_stop=True)

    def evaluation(wrapped):
        async def grow(ctx):
            question = await open_question(ctx, example, corpus)
            return await sample_chain(
                ctx, question, max_steps=3, temperature=temperature, chain="7", stop_bias=0.0
            )

        return Executor(wrapped, retriever).run([grow(Executor(wrapped, retriever).context())])[0]

    wrapped = RepeatsAtStepTwo(lm, {repeat})
    ex = Executor(wrapped, retriever)
    rolled = ex.run(
        [
            rollout_chain(
                ex.context(), example, corpus, chain="7", config=config, temperature=temperature or 1.0
            )
        ]
    )[0]
    rolled_asks = len(wrapped.asks)
    again = RepeatsAtStepTwo(lm, {repeat})
    grown = evaluation(again)
    assert rolled.result.steps == grown.steps and rolled.stopped == grown.stopped
    assert [r.seed for r in again.asks] == [r.seed for r in wrapped.asks] and len(again.asks) == rolled_asks
    if len(grown.steps) > 1:  # the repeat was asked again, at max(t, 0.7), not taken as a stop
        assert repeat in {r.seed for r in again.asks} and len(again.asks) == len(grown.steps) + 1
        assert [r.temperature for r in again.asks][2] == max(temperature, 0.7)
    answered = [s for s, kind in zip(rolled.steps_of, rolled.calls, strict=True) if kind == "subanswer"]
    assert answered == list(range(len(grown.steps)))


def test_no_retrieved_text_is_trained(groups, setup, toy_world):
    lm = setup[0]
    passages = {p.id: p.contents for p in toy_world.passages}
    with_documents = 0
    for chain in (c for g in groups for c in g):
        retrieved = {passages[d] for step in chain.result.steps for d in step.doc_ids}
        for row in chain_rows(chain):
            completion = lm.tokenizer.decode(row["completion_ids"])
            prompt = lm.tokenizer.decode(row["prompt_ids"])
            assert not any(text in completion for text in retrieved)
            with_documents += any(text in prompt for text in retrieved)
    assert with_documents > 0  # sub-answer prompts hold their documents, and they are prompt tokens


def test_rewards_come_from_the_metered_chain(groups):
    for chain in (c for g in groups for c in g):
        result = chain.result
        metered = sum(c.usage.total for _, c in chain.trace)
        assert result.usage.total == metered > 0
        f1 = answer_scores(result.prediction, result.answers)["f1"]
        assert chain.reward == pytest.approx(f1 - 0.5 * metered / 1000)
        em = answer_scores(result.prediction, result.answers)["em"]
        assert total_reward(result, parse_terms(["em"])) == em
        assert total_reward(result, parse_terms(["2*em", "-1*f1"])) == pytest.approx(2 * em - f1)


def brevity(result) -> float:
    """A user's own reward, named by its import path."""
    return -len(result.prediction)


def test_a_user_reward_by_import_path(groups):
    terms = parse_terms([f"{__name__}.brevity"])
    for chain in groups[0]:
        assert total_reward(chain.result, terms) == -len(chain.result.prediction)


def test_zero_spread(groups):
    for group in groups:
        assert zero_spread(group) == (len({round(c.reward, 9) for c in group}) == 1)


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

    again = run(setup, reward=["f1", "-0.5*tokens"])
    assert chains(again) == chains(groups)
    other = run(setup, key="step-1", reward=["f1", "-0.5*tokens"])
    assert chains(other) != chains(groups)


def test_loglik_reward_is_the_gold_answers_score_and_not_trained_on(setup):
    groups = run(setup, reward=["loglik"])
    for chain in (c for g in groups for c in g):
        assert chain.reward == chain.result.extras["gold_logprob"] < 0
        assert all(r.max_new_tokens > 0 for r, _ in chain.trace)  # generations only, no scoring call


def test_bad_settings_are_refused(setup):
    with pytest.raises(InputError, match="reward"):
        run(setup, reward=["bleu"])
    with pytest.raises(InputError, match="weight"):
        run(setup, reward=["x*f1"])
    with pytest.raises(InputError) as error:
        run(setup, sampled_calls=["subqueries"])
    assert error.value.field == "sampled_calls"
    with pytest.raises(InputError, match="temperature"):
        run(setup, temperature=0.0)
    lm, corpus, retriever, questions = setup
    with pytest.raises(InputError, match="at least 2"):
        rollout(
            Executor(lm, retriever), questions, corpus, RolloutConfig(), group_size=1, temperature=1, key="k"
        )


def hand_chain(steps, gold_logprobs, prediction, calls, steps_of):
    """A rolled-out chain built by hand: its steps' documents, the gold answer's log-likelihood after
    each prefix, the gold passages g1 and g2, and a trace of one sampled row a call."""
    from corag.chain import DecodeResult
    from corag.lm.base import Completion, GenerationRequest, Sample
    from corag.training.rollout import Chain
    from corag.types import Step, Usage

    result = DecodeResult(
        "q", "?", ("Ada",), "rollout", tuple(Step(f"s{i}", "a", docs) for i, docs in enumerate(steps)),
        prediction, (), Usage(), {"gold_logprobs": gold_logprobs, "gold_ids": ["g1", "g2"]},
    )  # fmt: skip
    row = (
        GenerationRequest((), temperature=0.7),
        Completion(("x",), Usage(), (Sample((1,), (2,), (-0.1,)),)),
    )
    return Chain(result, [row] * len(calls), calls, steps_of)


def test_step_rewards_and_advantages_by_hand():
    """Three steps: the gold answer's log-likelihood -4, -3, -3.5, -1 after 0..3 steps (gains 1, -0.5,
    2.5), gold passages found by steps 1 and 3 (recall gains 0.5, 0, 0.5), the answer right (F1 1); and
    a one-step chain that gains nothing and answers wrong. Reward f1 + 0.5*loglik_gain + recall_gain."""
    from corag.training.rewards import step_rewards
    from corag.training.rollout import assign_advantages

    calls = ["subquery", "subanswer", "stop", "subquery", "subanswer", "stop", "subquery", "subquery",
             "subanswer", "final"]  # fmt: skip
    steps_of = [0, 0, 0, 1, 1, 1, 2, 2, 2, None]
    three = hand_chain(
        [("g1", "x"), ("x", "y"), ("g2", "g1")], [-4.0, -3.0, -3.5, -1.0], "Ada", calls, steps_of
    )
    one = hand_chain([("y",)], [-4.0, -4.0], "Bob", ["subquery", "subanswer", "final"], [0, 0, None])
    terms = parse_terms(["f1", "0.5*loglik_gain", "recall_gain"])
    assert step_rewards(three.result, terms) == pytest.approx(
        [1.0, -0.25, 1.75]
    )  # 0.5*1+0.5, -0.25+0, 1.25+0.5
    assert step_rewards(one.result, terms) == [0.0]

    assign_advantages([three, one], terms, scale=False, credit="chain")  # rewards 1 + 2.5 and 0
    assert (three.reward, one.reward) == pytest.approx((3.5, 0.0))
    assert (three.advantage, one.advantage) == pytest.approx((1.75, -1.75))
    assert [row["advantage"] for row in chain_rows(three)] == pytest.approx([1.75] * 10)

    # per step: returns 1 + 2.5, 1 + 1.5, 1 + 1.75 and the final answer's 1; the other chain's 0 and 0;
    # their mean 9.75 / 6 = 1.625
    assign_advantages([three, one], terms, scale=False, credit="step")
    assert three.step_advantages == pytest.approx([1.875, 0.875, 1.125])
    assert three.advantage == pytest.approx(-0.625)
    assert (one.step_advantages, one.advantage) == (pytest.approx([-1.625]), pytest.approx(-1.625))
    rows = chain_rows(three)
    assert [r["advantage"] for r in rows] == pytest.approx(
        [1.875] * 3 + [0.875] * 3 + [1.125] * 3 + [-0.625]  # the repeated ask of step 3 is step 3's
    )
    assign_advantages([three, one], terms, scale=True, credit="step")
    std = math.sqrt((1.875**2 + 0.875**2 + 1.125**2 + 0.625**2 + 2 * 1.625**2) / 5)
    assert three.step_advantages[0] == pytest.approx(1.875 / (std + 1e-4))
    assert not zero_spread([three, one])


def test_per_step_credit_in_a_rollout(setup):
    groups = run(setup, reward=["f1", "loglik_gain"], credit="step", max_chain_length=2)
    for chain in (c for g in groups for c in g):
        steps = chain.result.steps
        assert len(chain.result.extras["gold_logprobs"]) == len(steps) + 1
        assert len(chain.step_advantages) == len(steps)
        answered = [s for s, kind in zip(chain.steps_of, chain.calls, strict=True) if kind == "subanswer"]
        assert answered == list(range(len(steps)))
        for row in chain_rows(chain):
            own = chain.advantage if row["step"] is None else chain.step_advantages[row["step"]]
            assert row["advantage"] == own
            assert (row["step"] is None) == (row["call"] == "final")


def test_bad_reward_input_is_one_line(setup):
    for spec, words in (
        (["bleu"], "unknown reward 'bleu'"),
        (["x*f1"], "weight 'x'"),
        (["nan*f1"], "weight 'nan'"),
    ):
        with pytest.raises(InputError, match=re.escape(words)) as error:
            parse_terms(spec)
        assert error.value.field == "reward" and "\n" not in str(error.value)
    lm, corpus, retriever, questions = setup
    bare = [replace(questions[0], supporting_ids=())]
    with pytest.raises(InputError, match="gold passages") as error:
        rollout(Executor(lm, retriever), bare, corpus, RolloutConfig(reward=["f1", "recall_gain"]),
                group_size=2, temperature=T, key="k")  # fmt: skip
    assert (error.value.record, error.value.field) == (questions[0].id, "supporting_ids")
    with pytest.raises(InputError) as error:
        RolloutConfig(credit="token").check()
    assert error.value.field == "credit"
