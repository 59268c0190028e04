"""Chain rewards: functions of one rolled-out chain, chosen by name in the config and summed with weights.

A reward function takes the chain's DecodeResult (its final answer, the gold answers, the steps with their
documents, the final answer's documents, the metered usage, and `extras`) and returns a float. The config's
`reward` is a list of terms `NAME` or `WEIGHT*NAME`, summed: `[f1]`, or `[f1, -0.05*tokens]` for F1 minus
0.05 per 1,000 tokens. NAME is one of REWARDS or an importable function `package.module.function` (a
user's own reward, written like the ones below).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from corag.chain import DecodeResult
from corag.errors import InputError
from corag.metrics import answer_scores

RewardFunc = Callable[[DecodeResult], float]


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


@dataclass(frozen=True)
class Term:
    """One weighted reward of the sum."""

    name: str
    weight: float
    function: RewardFunc


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
            raise InputError(f"bad weight in {spec!r}: expected WEIGHT*NAME", field="reward") from None
        terms.append(Term(name.strip(), weight, reward_function(name.strip())))
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
            f"unknown reward {name!r}: choose one of {sorted(REWARDS)} or an importable package.module.function",
            field="reward",
        )
    return function


def total_reward(result: DecodeResult, terms: Sequence[Term]) -> float:
    """The weighted sum of the terms for one chain."""
    return sum(term.weight * float(term.function(result)) for term in terms)
