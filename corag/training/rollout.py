"""Rollouts for reinforcement on chains (GRPO with retrieval in the loop).

For each training question, a group of G chains is drawn from the current policy through the executor
and the retriever, in the released prompt formats: a sub-query (call A), searched; a sub-answer over its
top-5 documents (call B); after each step but the last, the learned-stop decision drawn from the policy
(its Yes and No turns scored, Yes drawn with its share: corag.chain.stop_choice, the decision greedy
decoding's `stop_bias=0` takes); at the end, the final answer over the question's top-20
documents (call C). A repeated sub-query also ends the chain (nothing new would be found).

- **Sampled calls**: every call kind in `sampled_calls` (default all four) is sampled at the trainer's
  temperature, each from its own seed (question, chain, step); a kind left out is decoded greedily. Each
  generation keeps its exact prompt ids, the ids the sampler drew and their log-probabilities
  (corag.lm.base.Sample), so the trainer trains exactly what was sampled, with no text round trip.
- **Reward** of a chain: a weighted sum of reward functions of the chain (corag.training.rewards: EM, F1,
  the gold answer's log-likelihood, metered tokens, or a user's own).
- **Advantage**: group-normalised, (r - mean) / (std + 1e-4) over the question's G chains (std as
  torch.std, unbiased), or only centred (trl's scale_rewards "none"). A group whose rewards are all equal
  (zero spread) has advantage 0 everywhere: it teaches nothing.
- **Rows**: every sampled generation of a chain is a row (prompt ids, sampled ids, log-probabilities)
  carrying its chain's advantage; a greedy call stays in the chain but gives no row, so it carries no
  loss. Retrieved documents are only ever inside prompts, so they are never trained on.
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
    call_seed,
    finish,
    next_subquery,
    open_question,
    stop_choice,
    subanswer,
)
from corag.errors import InputError
from corag.executor import Context, Executor
from corag.lm.base import Completion, GenerationRequest
from corag.prompts import FINAL_NUM_DOCS
from corag.sampling import gold_logprob
from corag.training.rewards import Term, parse_terms, total_reward
from corag.types import Example, Step

CALLS = ("subquery", "subanswer", "stop", "final")
ADVANTAGE_EPS = 1e-4


@dataclass
class RolloutConfig:
    """How each chain of a group is grown and rewarded (the group's size, the sampling temperature and
    the advantage scaling are the trainer's: trl's num_generations, temperature and scale_rewards)."""

    max_chain_length: int = field(default=6, metadata={"help": "longest chain (L)"})
    docs: int = field(default=FINAL_NUM_DOCS, metadata={"help": "documents of the final answer (call C)"})
    sampled_calls: list[str] = field(
        default_factory=lambda: list(CALLS),
        metadata={"help": f"call kinds sampled (and trained); the others are greedy: some of {CALLS}"},
    )
    learned_stop: bool = field(
        default=True,
        metadata={"help": "ask the policy after each step whether to stop (depth is its choice)"},
    )
    reward: list[str] = field(
        default_factory=lambda: ["f1"],
        metadata={"help": "summed terms WEIGHT*NAME or NAME, e.g. f1 -0.05*tokens (corag.training.rewards)"},
    )
    max_extra_questions: int = field(
        default=8,
        metadata={
            "help": "dynamic sampling: groups whose chains all score alike are replaced by other questions' "
            "groups, at most this many more questions a generation batch (0: keep them)"
        },
    )

    def check(self) -> None:
        if self.max_chain_length < 0:
            raise InputError(f"must be 0 or more, got {self.max_chain_length}", field="max_chain_length")
        unknown = sorted(set(self.sampled_calls) - set(CALLS))
        if unknown:
            raise InputError(f"unknown call kind {unknown[0]!r}; choose from {CALLS}", field="sampled_calls")
        if self.max_extra_questions < 0:
            raise InputError(
                f"must be 0 or more, got {self.max_extra_questions}", field="max_extra_questions"
            )
        self.terms()

    def terms(self) -> list[Term]:
        return parse_terms(self.reward)


@dataclass
class Chain:
    """One sampled chain of a group: its result, every generation it made (with the kind of call), its
    reward and advantage."""

    result: DecodeResult
    trace: list[tuple[GenerationRequest, Completion]]
    calls: list[str]  # the kind of each traced generation (CALLS)
    reward: float = 0.0
    advantage: float = 0.0

    @property
    def stopped(self) -> bool:
        """Whether the policy ended the chain before max_chain_length (a Yes, or a repeated sub-query)."""
        return bool(self.result.extras.get("stopped"))


async def rollout_chain(
    ctx: Context,
    example: Example,
    corpus: CorpusLike,
    *,
    chain: str,
    config: RolloutConfig,
    temperature: float,
    limits: GenerationLimits | None = None,
    score_gold: bool = False,
) -> Chain:
    """One chain of the policy for one question, every generation kept (`ctx.trace`); with `score_gold`,
    also the gold answer's log-likelihood given the chain (the `loglik` reward)."""
    ctx.trace, calls = [], []
    heat = {call: temperature if call in config.sampled_calls else 0.0 for call in CALLS}

    def traced(kind: str) -> None:
        calls.extend([kind] * (len(ctx.trace) - len(calls)))

    question = await open_question(ctx, example, corpus, docs=config.docs, limits=limits)
    steps: list[Step] = []
    stopped = False
    while len(steps) < config.max_chain_length and not stopped:
        seed = call_seed(question.id, chain, len(steps), 0)
        query = await next_subquery(
            ctx, question.query, steps, question.task_desc, heat["subquery"], seed, question.limits
        )
        traced("subquery")
        if query in {s.subquery for s in steps}:
            stopped = True
            break
        step = await subanswer(
            ctx, query, corpus, limits=question.limits, temperature=heat["subanswer"], seed=seed + 1
        )
        traced("subanswer")
        steps.append(step)
        if config.learned_stop and len(steps) < config.max_chain_length:
            stopped = await stop_choice(
                ctx, question.query, steps, question.task_desc, heat["stop"], seed + 2
            )
            traced("stop")
    extras = {"chain": chain, "stopped": stopped}
    seed = call_seed(question.id, chain, len(steps), 1)
    result = await finish(ctx, question, example, "rollout", steps, extras, heat["final"], seed)
    traced("final")
    trace, ctx.trace = ctx.trace, None  # the reward's scoring below is not a generation of the chain
    if score_gold:
        result.extras["gold_logprob"] = await gold_logprob(ctx, example, steps, ())
    return Chain(result, trace, calls)


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
    """`group_size` chains for each question, the `sampled_calls` sampled at `temperature`, rewarded, with
    group advantages (scaled by the group's spread with `scale`); groups in question order.

    `key` (a training step, say) goes into every sampling seed: the same key samples the same chains,
    another key other chains.
    """
    config.check()
    if group_size < 2:
        raise InputError(f"a group needs at least 2 chains, got {group_size}", field="num_generations")
    if temperature <= 0:
        raise InputError(f"the chains of a group are sampled, got {temperature}", field="temperature")
    terms = config.terms()
    coros = [
        rollout_chain(
            executor.context(),
            example,
            corpus,
            chain=f"{key}/{g}",
            config=config,
            temperature=temperature,
            limits=limits,
            score_gold=any(term.name == "loglik" for term in terms),
        )  # fmt: skip
        for example in examples
        for g in range(group_size)
    ]
    chains = executor.run(coros)
    groups = [chains[i : i + group_size] for i in range(0, len(chains), group_size)]
    for group in groups:
        for chain in group:
            chain.reward = total_reward(chain.result, terms)
        advantages = group_advantages([c.reward for c in group], scale)
        for chain, advantage in zip(group, advantages, strict=True):
            chain.advantage = advantage
    return groups


def chain_rows(chain: Chain) -> list[dict[str, Any]]:
    """Every sampled generation of a chain as a row to train: the prompt's ids, the ids the sampler drew,
    their log-probabilities and the chain's advantage. Greedy calls (temperature 0) give no row."""
    rows = []
    for kind, (request, completion) in zip(chain.calls, chain.trace, strict=True):
        if request.temperature <= 0:
            continue
        for sample in completion.samples:
            if sample.token_ids:
                rows.append(
                    {
                        "prompt_ids": sample.prompt_ids,
                        "completion_ids": sample.token_ids,
                        "logprobs": sample.logprobs,
                        "advantage": chain.advantage,
                        "call": kind,
                    }
                )
    return rows


def zero_spread(group: Sequence[Chain]) -> bool:
    """Whether every chain of the group scored alike (advantage 0 everywhere: no gradient)."""
    return max(c.reward for c in group) - min(c.reward for c in group) < 1e-9
