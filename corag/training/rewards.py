"""Chain rewards: functions of one rolled-out chain, chosen by name in the config and summed with weights.

A reward function takes the chain's DecodeResult (its final answer, the gold answers, the steps with their
documents, the final answer's documents, the metered usage, and `extras`) and returns a float. The config's
`reward` is a list of terms `NAME` or `WEIGHT*NAME`, summed: `[f1]`, or `[f1, -0.05*tokens]` for F1 minus
0.05 per 1,000 tokens. NAME is one of REWARDS or an importable function `package.module.function` (a
user's own reward, written like the ones below).

Step rewards (STEP_REWARDS) credit each step of the chain: a list with one value a step. `loglik_gain`,
the gain in the gold answer's mean log-likelihood (call C without documents, as rejection sampling scores
chains) that the step brought; `recall_gain`, the share of the question's gold passages (`supporting_ids`)
the step's documents found first. Weighted in the same list (`[f1, 0.5*loglik_gain]`); how they reach the
trained rows (summed into the chain's reward, or each step's rows its own advantage) is the rollout's
`credit`.
"""

from __future__ import annotations

import importlib
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from corag.chain import DecodeResult
from corag.errors import InputError
from corag.metrics import answer_scores
from corag.types import Example

RewardFunc = Callable[[DecodeResult], float]
StepRewardFunc = Callable[[DecodeResult], list[float]]


def em(result: DecodeResult) -> float:
    """Exact match of the final answer with any gold answer (the paper's SQuAD rule)."""
    return answer_scores(result.prediction, result.answers)["em"]


def f1(result: DecodeResult) -> float:
    """Token F1 of the final answer against the best gold answer (the paper's SQuAD rule)."""
    return answer_scores(result.prediction, result.answers)["f1"]


def loglik(result: DecodeResult) -> float:
    """Mean log-likelihood of the first gold answer given the chain (rejection sampling's score: call C
    without documents); the rollout scores it when this reward is asked for."""
    return float(result.extras["gold_logprob"])


def tokens(result: DecodeResult) -> float:
    """Thousands of tokens the chain's calls were metered (give it a negative weight: a cost)."""
    return result.usage.total / 1000


REWARDS: dict[str, RewardFunc] = {"em": em, "f1": f1, "loglik": loglik, "tokens": tokens}


def loglik_gain(result: DecodeResult) -> list[float]:
    """Per step: the gold answer's mean log-likelihood after it less before it (the rollout scores every
    prefix of the chain, `extras["gold_logprobs"]`: no steps, one, ..., all)."""
    scores = result.extras["gold_logprobs"]
    return [after - before for before, after in itertools.pairwise(scores)]


def recall_gain(result: DecodeResult) -> list[float]:
    """Per step: the share of the gold passages (`extras["gold_ids"]`) first found among its documents."""
    gold, seen, gains = set(result.extras["gold_ids"]), set(), []
    for step in result.steps:
        new = (set(step.doc_ids) & gold) - seen
        seen |= new
        gains.append(len(new) / len(gold))
    return gains


STEP_REWARDS: dict[str, StepRewardFunc] = {"loglik_gain": loglik_gain, "recall_gain": recall_gain}
NEEDS = {
    "loglik": "gold_logprob",
    "loglik_gain": "gold_logprobs",
    "recall_gain": "gold_ids",
}  # rollout extras


@dataclass(frozen=True)
class Term:
    """One weighted reward of the sum: of the chain, or (`step`) one value a step."""

    name: str
    weight: float
    function: RewardFunc | StepRewardFunc
    step: bool = False


def parse_terms(specs: Sequence[str]) -> list[Term]:
    """`["f1", "-0.05*tokens"]` -> weighted terms; an unknown name or a bad weight is one InputError."""
    if not specs:
        raise InputError("at least one reward is needed, e.g. [f1]", field="reward")
    terms = []
    for spec in specs:
        weight_text, star, name = str(spec).strip().rpartition("*")
        try:
            weight = float(weight_text) if star else 1.0
        except ValueError:
            weight = math.nan
        if not math.isfinite(weight):
            raise InputError(
                f"the weight {weight_text.strip()!r} of {spec!r} is not a number: expected WEIGHT*NAME, "
                "e.g. 0.5*f1",
                field="reward",
            )
        name = name.strip()
        if name in STEP_REWARDS:
            terms.append(Term(name, weight, STEP_REWARDS[name], step=True))
        else:
            terms.append(Term(name, weight, reward_function(name)))
    return terms


def reward_function(name: str) -> RewardFunc:
    """A reward by name: one of REWARDS, or `package.module.function` imported."""
    if name in REWARDS:
        return REWARDS[name]
    module, _, attribute = name.rpartition(".")
    try:
        function = getattr(importlib.import_module(module), attribute) if module else None
    except (ImportError, AttributeError):
        function = None
    if not callable(function):
        raise InputError(
            f"unknown reward {name!r}: choose one of {sorted(REWARDS)}, a step reward of "
            f"{sorted(STEP_REWARDS)}, or an importable package.module.function",
            field="reward",
        )
    return function


def check_reward_data(terms: Sequence[Term], examples: Sequence[Example], file: str | None = None) -> None:
    """Before any rollout: every question has what the rewards read (gold passages for `recall_gain`)."""
    if any(term.name == "recall_gain" for term in terms):
        bare = next((e for e in examples if not e.supporting_ids), None)
        if bare is not None:
            raise InputError(
                "has no gold passages (supporting_ids) for the step reward recall_gain",
                file=file,
                record=bare.id,
                field="supporting_ids",
            )


def total_reward(result: DecodeResult, terms: Sequence[Term]) -> float:
    """The weighted sum of the chain's terms (outcome rewards only: step terms are `step_rewards`)."""
    return sum(term.weight * float(term.function(result)) for term in terms if not term.step)


def step_rewards(result: DecodeResult, terms: Sequence[Term]) -> list[float]:
    """One reward a step of the chain: the weighted sum of its step terms (zeros without any)."""
    rewards = [0.0] * len(result.steps)
    for term in (t for t in terms if t.step):
        values = term.function(result)
        rewards = [r + term.weight * float(v) for r, v in zip(rewards, values, strict=True)]
    return rewards
