"""Rollouts for reinforcement on chains (GRPO with retrieval in the loop).

For each training question, a group of G chains is drawn from the current policy through the executor
and the retriever, in the released prompt formats: a sub-query (call A), searched; a sub-answer over its
top-5 documents (call B); after each step but the last, the learned-stop decision drawn from the policy
(its Yes and No turns scored in one call at the model's own temperature, Yes drawn with its share:
corag.chain.stop_choice, the decision greedy decoding's `stop_bias=0` takes from the same scores); at the
end, the final answer over the question's top-20 documents (call C). A chain grows by the loop greedy
decoding runs (corag.decoding.greedy.sample_chain): a repeated sub-query is asked again at max(t, 0.7),
at most 4 sub-query calls a step, as in evaluation.

- **Sampled calls**: every call kind in `sampled_calls` (default all four) is sampled at the trainer's
  temperature, each from its own seed (question, chain, step); a kind left out is decoded greedily. Each
  generation keeps its exact prompt ids, the ids the sampler drew and their log-probabilities
  (corag.lm.base.Sample), so the trainer trains exactly what was sampled, with no text round trip.
- **Reward** of a chain: a weighted sum of reward functions of the chain (corag.training.rewards: EM, F1,
  the gold answer's log-likelihood, metered tokens, or a user's own), and of step rewards, one value a
  step (the gain in the gold answer's log-likelihood a step brought, the gold passages it found first).
- **Advantage**: group-normalised, (r - mean) / (std + 1e-4) over the question's G chains (std as
  torch.std, unbiased), or only centred (trl's scale_rewards "none"). A group whose rewards are all equal
  (zero spread) has advantage 0 everywhere: it teaches nothing. With `credit: chain` the step rewards are
  summed into the chain's reward and every row carries the chain's advantage; with `credit: step` each
  step's rows (its sub-query, sub-answer and the stop decision after it) carry the advantage of what
  follows from it, the outcome plus the step rewards from that step on, normalised over every step and
  final answer of the group, and the final answer's rows that of the outcome.
- **Rows**: every sampled generation of a chain is a row (prompt ids, sampled ids, log-probabilities)
  carrying its advantage; a greedy call stays in the chain but gives no row, so it carries no loss.
  Retrieved documents are only ever inside prompts, so they are never trained on.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from corag.chain import CorpusLike, DecodeResult, GenerationLimits, call_seed, finish, open_question
from corag.decoding.greedy import sample_chain
from corag.errors import InputError
from corag.executor import Context, Executor
from corag.lm.base import MAX_BATCH_TOKENS, Completion, GenerationRequest
from corag.prompts import FINAL_NUM_DOCS
from corag.sampling import gold_logprob
from corag.training.rewards import NEEDS, Term, check_reward_data, parse_terms, step_rewards, total_reward
from corag.types import Example

CALLS = ("subquery", "subanswer", "stop", "final")
CREDITS = ("chain", "step")
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
    credit: str = field(
        default="chain",
        metadata={"help": f"advantages per chain or per step (step rewards to go), one of {CREDITS}"},
    )
    shuffle_advantages: bool = field(
        default=False,
        metadata={"help": "a placebo: the trained chains' advantages shuffled over the generation batch"},
    )
    logprob_batch_tokens: int = field(
        default=MAX_BATCH_TOKENS,
        metadata={
            "help": "tokens per forward of the trainer's log-probability passes (old policy, reference)"
        },
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
        if self.credit not in CREDITS:
            raise InputError(f"unknown credit {self.credit!r}; choose one of {CREDITS}", field="credit")
        if self.logprob_batch_tokens < 1:
            raise InputError(
                f"must be 1 or more, got {self.logprob_batch_tokens}", field="logprob_batch_tokens"
            )
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
    steps_of: list[int | None] = field(default_factory=list)  # each traced generation's step (None: final)
    reward: float = 0.0
    advantage: float = 0.0  # of the chain, or with credit per step of its final answer
    step_advantages: list[float] = field(default_factory=list)  # with credit per step: one a step

    @property
    def stopped(self) -> bool:
        """Whether the policy's stop decision ended the chain (a Yes)."""
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
    needs: frozenset[str] = frozenset(),
) -> Chain:
    """One chain of the policy for one question, every generation kept (`ctx.trace`) with its kind and
    step; and what the rewards `needs` (corag.training.rewards.NEEDS): the gold answer's log-likelihood
    given the chain, or given each of its prefixes, or the gold passages."""
    ctx.trace, calls, steps_of = [], [], []
    heat = {call: temperature if call in config.sampled_calls else 0.0 for call in CALLS}

    def traced(kind: str) -> None:
        answered = calls.count("subanswer")
        step = None if kind == "final" else answered - (kind == "stop")  # a stop follows its step
        calls.extend([kind] * (len(ctx.trace) - len(calls)))
        steps_of.extend([step] * (len(calls) - len(steps_of)))

    question = await open_question(ctx, example, corpus, docs=config.docs, limits=limits)
    grown = await sample_chain(
        ctx,
        question,
        max_steps=config.max_chain_length,
        temperature=heat["subquery"],
        chain=chain,
        stop_bias=0.0 if config.learned_stop else None,
        for_final=False,
        subanswer_temperature=heat["subanswer"],
        sample_stop=heat["stop"] > 0,
        mark=traced,
    )
    extras = {"chain": chain, "stopped": grown.stopped}
    seed = call_seed(question.id, chain, len(grown.steps), 0)
    result = await finish(ctx, question, example, "rollout", grown.steps, extras, heat["final"], seed)
    traced("final")
    trace, ctx.trace = ctx.trace, None  # the reward's scoring below is not a generation of the chain
    steps_of = [s if s is None or s < len(grown.steps) else None for s in steps_of]  # an unanswered ask
    if "gold_logprobs" in needs:
        prefixes = [grown.steps[:i] for i in range(len(grown.steps) + 1)]
        scores = await ctx.gather(*(gold_logprob(ctx, example, p, ()) for p in prefixes))
        result.extras["gold_logprobs"], result.extras["gold_logprob"] = scores, scores[-1]
    elif "gold_logprob" in needs:
        result.extras["gold_logprob"] = await gold_logprob(ctx, example, grown.steps, ())
    if "gold_ids" in needs:
        result.extras["gold_ids"] = list(example.supporting_ids)
    return Chain(result, trace, calls, steps_of)


def group_advantages(rewards: Sequence[float], scale: bool = True) -> list[float]:
    """(r - mean) / (std + 1e-4) over one question's chains; only centred without `scale`."""
    mean = statistics.fmean(rewards)
    std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    return [(r - mean) / (std + ADVANTAGE_EPS) if scale else r - mean for r in rewards]


def assign_advantages(group: Sequence[Chain], terms: Sequence[Term], scale: bool, credit: str) -> None:
    """Each chain's reward (outcome plus its step rewards) and advantages, by `credit` (CREDITS): per
    chain, the group-normalised reward; per step, each step's return (the outcome plus the step rewards
    from it on) and each final answer's (the outcome), normalised together over the group."""
    outcome = [total_reward(c.result, terms) for c in group]
    per_step = [step_rewards(c.result, terms) for c in group]
    for chain, r, steps in zip(group, outcome, per_step, strict=True):
        chain.reward = r + sum(steps)
    if credit == "chain":
        for chain, advantage in zip(group, group_advantages([c.reward for c in group], scale), strict=True):
            chain.advantage, chain.step_advantages = advantage, []
        return
    returns = [
        [r + sum(steps[i:]) for i in range(len(steps))] + [r]
        for r, steps in zip(outcome, per_step, strict=True)
    ]
    flat = group_advantages([g for chain_returns in returns for g in chain_returns], scale)
    for chain, chain_returns in zip(group, returns, strict=True):
        own, flat = flat[: len(chain_returns)], flat[len(chain_returns) :]
        chain.step_advantages, chain.advantage = own[:-1], own[-1]


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
    check_reward_data(terms, examples)
    needs = frozenset(NEEDS[t.name] for t in terms if t.name in NEEDS)
    coros = [
        rollout_chain(
            executor.context(),
            example,
            corpus,
            chain=f"{key}/{g}",
            config=config,
            temperature=temperature,
            limits=limits,
            needs=needs,
        )  # fmt: skip
        for example in examples
        for g in range(group_size)
    ]
    chains = executor.run(coros)
    groups = [chains[i : i + group_size] for i in range(0, len(chains), group_size)]
    for group in groups:
        assign_advantages(group, terms, scale, config.credit)
    return groups


def chain_rows(chain: Chain) -> list[dict[str, Any]]:
    """Every sampled generation of a chain as a row to train: the prompt's ids, the ids the sampler drew,
    their log-probabilities and the advantage (its step's with credit per step, else the chain's). Greedy
    calls (temperature 0) give no row."""
    rows = []
    steps_of = chain.steps_of or [None] * len(chain.calls)
    for kind, step, (request, completion) in zip(chain.calls, steps_of, chain.trace, strict=True):
        if request.temperature <= 0:
            continue
        advantage = (
            chain.step_advantages[step] if chain.step_advantages and step is not None else chain.advantage
        )
        for sample in completion.samples:
            if sample.token_ids:
                rows.append(
                    {
                        "prompt_ids": sample.prompt_ids,
                        "completion_ids": sample.token_ids,
                        "logprobs": sample.logprobs,
                        "advantage": advantage,
                        "call": kind,
                        "step": step,
                    }
                )
    return rows


def shuffle_advantages(groups: Sequence[Sequence[Chain]], rng: random.Random) -> None:
    """A placebo: every advantage of the batch's chains (and of their steps) dealt out again in a random
    order, so that updates keep their sizes and signs' mix but no longer follow what the chains earned."""
    chains = [chain for group in groups for chain in group]
    pool = [a for c in chains for a in (c.advantage, *c.step_advantages)]
    rng.shuffle(pool)
    for chain in chains:
        n = len(chain.step_advantages)
        chain.advantage, chain.step_advantages, pool = pool[0], pool[1 : n + 1], pool[n + 1 :]


def zero_spread(group: Sequence[Chain]) -> bool:
    """Whether the group teaches nothing: every advantage (of the chains, or of their steps) is 0."""
    return all(abs(a) < 1e-9 for c in group for a in (c.advantage, *c.step_advantages))
