"""Rollouts for reinforcement on chains (GRPO with retrieval in the loop).

For each training question, a group of G chains is sampled by the current policy through the executor
and the retriever, as decoding samples them: sub-queries at a temperature, each searched, sub-answers
greedy over the top-5 documents, then the final answer over the question's top-20 documents (call C).

- **Reward** of a chain: its final answer against the gold answers (EM or F1, the paper's SQuAD rule),
  or the mean log-likelihood of the first gold answer given the chain (rejection sampling's score, call
  C without documents); minus `token_cost` per 1,000 tokens the chain's calls were metered.
- **Advantage**: group-normalised, (r - mean) / (std + 1e-4) over the question's G chains (std as
  torch.std, unbiased), or only centred (trl's scale_rewards "none"). A group whose rewards are all equal
  has advantage 0 everywhere: it teaches nothing.
- **Pairs**: every generation the chain made (each sub-query call, each sub-answer call, the final
  answer; a sub-query asked again after a repeat too) becomes a prompt/completion pair with the exact
  messages the model was sent (the released prompt formats, cut as they were cut) and its text as
  generated, stripped. Each pair carries its chain's advantage. Retrieved documents are only ever inside
  prompts, so they are never trained on; an empty generation gives no pair.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from corag.chain import (
    CorpusLike,
    DecodeResult,
    GenerationLimits,
    finish,
    open_question,
)
from corag.decoding.greedy import sample_chain
from corag.errors import InputError
from corag.executor import Context, Executor
from corag.metrics import answer_scores
from corag.prompts import FINAL_NUM_DOCS
from corag.sampling import gold_logprob
from corag.types import Example

REWARDS = ("f1", "em", "loglik")
ADVANTAGE_EPS = 1e-4


@dataclass
class RolloutConfig:
    """How each chain of a group is grown and rewarded (the group's size, the sampling temperature and
    the advantage scaling are the trainer's: trl's num_generations, temperature and scale_rewards)."""

    max_chain_length: int = field(default=6, metadata={"help": "longest chain (L)"})
    docs: int = field(default=FINAL_NUM_DOCS, metadata={"help": "documents of the final answer (call C)"})
    reward: str = field(default="f1", metadata={"help": f"one of {REWARDS}"})
    token_cost: float = field(
        default=0.0, metadata={"help": "subtracted from the reward per 1,000 metered tokens of the chain"}
    )

    def check(self) -> None:
        if self.max_chain_length < 0:
            raise InputError(f"must be 0 or more, got {self.max_chain_length}", field="max_chain_length")
        if self.reward not in REWARDS:
            raise InputError(f"unknown reward {self.reward!r}; choose one of {REWARDS}", field="reward")


@dataclass
class Chain:
    """One sampled chain of a group: its result, every generation it made, its reward and advantage."""

    result: DecodeResult
    trace: list[tuple[Any, Any]]  # (GenerationRequest, Completion) in call order
    reward: float = 0.0
    advantage: float = 0.0


async def rollout_chain(
    ctx: Context,
    example: Example,
    corpus: CorpusLike,
    *,
    chain: str,
    config: RolloutConfig,
    temperature: float,
    limits: GenerationLimits | None = None,
) -> Chain:
    """One chain of the policy for one question, every generation kept (`ctx.trace`)."""
    ctx.trace = []
    question = await open_question(ctx, example, corpus, docs=config.docs, limits=limits)
    steps = await sample_chain(
        ctx, question, max_steps=config.max_chain_length, temperature=temperature, chain=chain
    )
    result = await finish(ctx, question, example, "rollout", steps, {"chain": chain})
    trace, ctx.trace = ctx.trace, None  # the reward's scoring below is not a generation of the chain
    if config.reward == "loglik":
        result.extras["gold_logprob"] = await gold_logprob(ctx, example, steps, ())
    return Chain(result, trace)


def chain_reward(result: DecodeResult, config: RolloutConfig) -> float:
    """The chain's reward (see the module's docstring); `result.usage` is what its calls were metered."""
    if config.reward == "loglik":
        base = float(result.extras["gold_logprob"])
    else:
        base = answer_scores(result.prediction, result.answers)[config.reward]  # the paper's SQuAD rule
    return base - config.token_cost * result.usage.total / 1000


def group_advantages(rewards: Sequence[float], scale: bool = True) -> list[float]:
    """(r - mean) / (std + 1e-4) over one question's chains; only centred without `scale`."""
    mean = statistics.fmean(rewards)
    std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    return [(r - mean) / (std + ADVANTAGE_EPS) if scale else r - mean for r in rewards]


def rollout(
    executor: Executor,
    examples: Sequence[Example],
    corpus: CorpusLike,
    config: RolloutConfig,
    *,
    group_size: int,
    temperature: float,
    key: str,
    scale: bool = True,
    limits: GenerationLimits | None = None,
) -> list[list[Chain]]:
    """`group_size` chains for each question, sub-queries sampled at `temperature`, rewarded, with group
    advantages (scaled by the group's spread with `scale`); groups in question order.

    `key` (a training step, say) goes into every sampling seed: the same key samples the same chains,
    another key other chains.
    """
    config.check()
    if group_size < 2:
        raise InputError(f"a group needs at least 2 chains, got {group_size}", field="num_generations")
    if temperature <= 0:
        raise InputError(f"the chains of a group are sampled, got {temperature}", field="temperature")
    coros = [
        rollout_chain(
            executor.context(),
            example,
            corpus,
            chain=f"{key}/{g}",
            config=config,
            temperature=temperature,
            limits=limits,
        )  # fmt: skip
        for example in examples
        for g in range(group_size)
    ]
    chains = executor.run(coros)
    groups = [chains[i : i + group_size] for i in range(0, len(chains), group_size)]
    for group in groups:
        for chain in group:
            chain.reward = chain_reward(chain.result, config)
        advantages = group_advantages([c.reward for c in group], scale)
        for chain, advantage in zip(group, advantages, strict=True):
            chain.advantage = advantage
    return groups


def chain_pairs(chain: Chain) -> list[dict[str, Any]]:
    """Every generation of a chain as a prompt/completion pair carrying the chain's advantage."""
    pairs = []
    for index, (request, completion) in enumerate(chain.trace):
        text = completion.texts[0].strip()
        if not text:
            continue
        pairs.append(
            {
                "prompt": [dict(m) for m in request.messages],
                "completion": [{"role": "assistant", "content": text}],
                "advantage": chain.advantage,
                "chain_id": f"{chain.result.query_id}/{chain.result.extras['chain']}",
                "call": index,
            }
        )
    return pairs
