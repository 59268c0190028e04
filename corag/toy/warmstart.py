"""Warm-start examples for a tiny model trained from scratch on the toy world.

The paper starts from an instruct model that can already read a passage and ask a follow-up question.
A tiny model built from config can do neither, so before rejection sampling it is taught the three
CoRAG calls on freshly generated toy worlds (never the target world), in the exact CoRAG prompts:

- reading (call B): a single-hop sub-query and the top passages a BM25 retriever returns for it in that
  world (hard negatives that share the subject's name-word or the relation), target the answer;
- decomposition (call A): the gold steps so far of a multi-hop question, target the next gold sub-query;
- final answer (call C): the gold chain and the question's top-20 passages (or none), target the answer.
  One-hop chains are among them: with a single intermediate answer to copy, the model learns to find
  the answer in the chain, which it then carries over to the last answer of longer chains.

Names in a fresh world are new combinations of the shared name pool, so facts cannot be memorised: the
only way to fit the examples is to read and copy. Everything is fixed by the seed.

Examples are conversational prompt/completion dicts (as corag.training writes them), which trl consumes:
`{"prompt": [user], "completion": [assistant], "task": "subanswer"|"subquery"|"final", "id": ...}`.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections import deque
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tqdm import tqdm

from corag import prompts
from corag.retrieval.bm25 import BM25Retriever
from corag.toy.world import ToyWorld, fact_sentence, generate_world
from corag.training.examples import tokenize_example
from corag.types import Example, Passage

TASK_DESC = prompts.task_description("multihopqa")
# Fresh worlds draw seeds from [FRESH_SEED_MIN, 2**31): far from the small seeds target worlds use.
FRESH_SEED_MIN = 1_000_000


@dataclass(frozen=True)
class WarmStartConfig:
    """How many examples of each call one fresh world gives, and the worlds' sizes."""

    reading_per_world: int = 400  # call B examples (single-hop facts, drawn without replacement)
    subquery_questions_per_world: int = 40  # multi-hop questions whose every step becomes a call A example
    repeat_when_done: bool = True  # after the last gold step, call A repeats its last sub-query
    final_per_world: int = 60  # call C examples (gold chains)
    reading_docs: tuple[int, ...] = (5,)  # passages shown per reading example, drawn uniformly from these
    # Passages shown in a world's final examples, drawn per world: none (as when sampling scores a
    # chain) or the question's top 20 (as at evaluation). With one world in four at 20, call C read
    # the chain's answer for 83% of 3-hop questions without passages but 55% with 20; with one in two,
    # 70% and 57%, and the study's 3-hop EM rose from 16.7 to 19.3 (docs/toy-study.md).
    final_docs: tuple[int, ...] = (0, 20)
    num_entities: int = 300
    num_distractors: int = 60
    hops: tuple[int, ...] = (2, 3, 4)  # hop counts of the questions call A examples come from
    # Hop counts of the chains final examples come from. Without one-hop chains a two-layer model never
    # left the plateau of call C (0% held-out after 3500 mixed steps); with them it reads the last
    # answer of 2-4 hop chains within a few hundred steps (docs/toy-study.md).
    final_hops: tuple[int, ...] = (1, 2, 3, 4)
    # Share of reading examples shown without their fact's passage, target "No relevant information
    # found" (what call B's prompt asks for then), whose probability is best-of-N's penalty. Taught
    # so, the warm model said it, but its penalty ranked chains backwards (docs/toy-study.md).
    unanswerable: float = 0.0


def iter_fresh_seeds(seed: int, exclude: Collection[int] = ()) -> Iterator[int]:
    """Distinct world seeds fixed by `seed`, none in `exclude` (the target worlds' seeds), without end."""
    seen: set[int] = set()
    for index in itertools.count():
        digest = hashlib.blake2b(f"warmstart|{seed}|{index}".encode(), digest_size=8).digest()
        candidate = FRESH_SEED_MIN + int.from_bytes(digest, "big") % (2**31 - FRESH_SEED_MIN)
        if candidate not in exclude and candidate not in seen:
            seen.add(candidate)
            yield candidate


def fresh_seeds(seed: int, count: int, exclude: Collection[int] = ()) -> list[int]:
    """The first `count` of `iter_fresh_seeds`."""
    return list(itertools.islice(iter_fresh_seeds(seed, exclude), count))


def fresh_world(world_seed: int, config: WarmStartConfig) -> ToyWorld:
    """A fresh world of the configured sizes; its questions are only a source of gold chains."""
    n = max(config.subquery_questions_per_world, config.final_per_world)
    return generate_world(
        seed=world_seed,
        num_entities=config.num_entities,
        num_distractors=config.num_distractors,
        train_per_hop=n,
        test_per_hop=1,
        hops=tuple(sorted({*config.hops, *config.final_hops})),
    )


def example(task: str, ex_id: str, messages: list[dict[str, str]], target: str) -> dict[str, Any]:
    """One prompt/completion example in the shape corag.training writes and trl reads."""
    return {
        "prompt": messages,
        "completion": [{"role": "assistant", "content": target}],
        "task": task,
        "id": ex_id,
    }


def _search(
    retriever: BM25Retriever, by_id: dict[str, Passage], queries: list[str], k: int
) -> list[list[Passage]]:
    if not queries:
        return []
    return [[by_id[h.doc_id] for h in hits] for hits in retriever.search(queries, k)]


def reading_examples(
    world: ToyWorld,
    retriever: BM25Retriever,
    rng: random.Random,
    count: int,
    num_docs: Sequence[int] = (5,),
    unanswerable: float = 0.0,
) -> list[dict[str, Any]]:
    """Call B examples: a single-hop fact's sub-query over its top BM25 passages, target the answer.

    Only facts whose passage is among the passages shown are used (with BM25 on the toy world that is
    nearly every fact), so the answer can always be read: it appears in exactly one shown passage as
    `The <relation> of <subject> is <answer>.` A share `unanswerable` of the facts is shown instead
    with the next passages in its place and none that states the relation of that name (a namesake's
    included), target "No relevant information found".
    """
    facts = rng.sample(world.single_hop, min(count, len(world.single_hop)))
    sizes = [rng.choice(num_docs) for _ in facts]
    # Without a share no draw is made and no deeper search run: the default stream stays as it was.
    hidden = [rng.random() < unanswerable for _ in facts] if unanswerable else [False] * len(facts)
    spare = 3 if any(hidden) else 0  # passages searched beyond those shown, to fill hidden ones' places
    by_id = {p.id: p for p in world.passages}
    shown = _search(retriever, by_id, [f.query for f in facts], max(num_docs) + spare)
    out = []
    for fact, size, hide, passages in zip(facts, sizes, hidden, shown, strict=True):
        if hide:
            stated = fact_sentence(fact.meta["relations"][0], fact.supporting_titles[0], "").removesuffix(".")
            passages = [p for p in passages if stated not in p.contents][:size]
            messages = prompts.subanswer_messages(fact.query, passages)
            out.append(example("subanswer", f"{fact.id}/no_info", messages, prompts.NO_INFO))
            continue
        passages = passages[:size]
        if not _readable(fact, passages):
            continue
        messages = prompts.subanswer_messages(fact.query, passages)
        out.append(example("subanswer", f"{fact.id}/subanswer", messages, fact.answers[0]))
    return out


def _readable(fact: Example, passages: Sequence[Passage]) -> bool:
    """Whether exactly one passage states the fact (its own passage is among them)."""
    (step,) = fact.decomposition
    relation = fact.meta["relations"][0]
    sentence = fact_sentence(relation, fact.supporting_titles[0], step.subanswer)
    return sum(sentence in p.contents for p in passages) == 1 and step.doc_ids[0] in {p.id for p in passages}


def _with_hops(world: ToyWorld, hops: Collection[int] | None) -> list[Example]:
    """The world's training questions with a hop count in `hops` (all when None)."""
    return [ex for ex in world.train if hops is None or ex.meta["hops"] in hops]


def subquery_examples(
    world: ToyWorld,
    rng: random.Random,
    questions: int,
    repeat_when_done: bool = False,
    hops: Collection[int] | None = None,
) -> list[dict[str, Any]]:
    """Call A examples: for each step i of a gold decomposition, the steps before i -> sub-query i.

    With `repeat_when_done`, the finished chain -> its last sub-query again. Decoding discards a repeated
    sub-query and retries, so a model that repeats once it is done ends its chain with the gold steps
    instead of adding steps that the final answer would have to look past. Questions come from those
    with a hop count in `hops` (all when None).
    """
    pool = _with_hops(world, hops)
    out = []
    for ex in rng.sample(pool, min(questions, len(pool))):
        steps = ex.decomposition
        targets = [s.subquery for s in steps] + ([steps[-1].subquery] if repeat_when_done else [])
        for i, target in enumerate(targets):
            messages = prompts.subquery_messages(ex.query, steps[:i], TASK_DESC)
            out.append(example("subquery", f"{ex.id}/subquery/{i}", messages, target))
    return out


def final_examples(
    world: ToyWorld,
    retriever: BM25Retriever,
    rng: random.Random,
    count: int,
    num_docs: Sequence[int] = (0, 20),
    hops: Collection[int] | None = None,
) -> list[dict[str, Any]]:
    """Call C examples: the whole gold chain (and the question's top passages), target the answer;
    questions come from those with a hop count in `hops` (all when None)."""
    pool = _with_hops(world, hops)
    chosen = rng.sample(pool, min(count, len(pool)))
    sizes = [rng.choice(num_docs) for _ in chosen]
    by_id = {p.id: p for p in world.passages}
    shown = _search(retriever, by_id, [ex.query for ex in chosen], max(num_docs))
    out = []
    for ex, size, passages in zip(chosen, sizes, shown, strict=True):
        messages = prompts.final_answer_messages(ex.query, ex.decomposition, TASK_DESC, passages[:size])
        out.append(example("final", f"{ex.id}/final", messages, ex.answers[0]))
    return out


def world_examples(world_seed: int, config: WarmStartConfig) -> list[dict[str, Any]]:
    """All warm-start examples of one fresh world, in a seeded random order."""
    world = fresh_world(world_seed, config)
    rng = random.Random(f"warmstart-examples|{world_seed}")
    retriever = BM25Retriever.from_passages(world.passages)
    out = reading_examples(
        world, retriever, rng, config.reading_per_world, config.reading_docs, config.unanswerable
    )
    out += subquery_examples(
        world, rng, config.subquery_questions_per_world, config.repeat_when_done, config.hops
    )
    # One size per world, so a batch of final examples is not padded from 200 to 1000 tokens.
    size = rng.choice(config.final_docs)
    out += final_examples(world, retriever, rng, config.final_per_world, (size,), config.final_hops)
    rng.shuffle(out)
    return out


def iter_examples(
    seed: int, num_worlds: int, config: WarmStartConfig = WarmStartConfig(), exclude: Collection[int] = ()
) -> Iterator[dict[str, Any]]:
    """Warm-start examples world after world, from `num_worlds` fresh worlds (none seeded in `exclude`)."""
    for world_seed in tqdm(
        fresh_seeds(seed, num_worlds, exclude), desc="warm-start worlds", disable=num_worlds < 20
    ):
        yield from world_examples(world_seed, config)


# ------------------------------------------------------------------------------------------ training


@dataclass(frozen=True)
class WarmPhase:
    """One stage of the warm start: `steps` optimiser steps on a mixture of the three calls."""

    steps: int
    batch_tokens: int  # padded tokens per batch
    reading_docs: tuple[int, ...]  # passages shown per reading example
    weights: tuple[tuple[str, float], ...]  # (task, share of batches)
    learning_rate: float  # the peak of this phase's schedule
    prompt_loss: tuple[str, ...] = ()  # tasks trained on every token, prompt included
    unanswerable: float = 0.0  # share of reading examples without the fact's passage

    def world_config(self, worlds: WarmStartConfig) -> WarmStartConfig:
        """`worlds` with this phase's passages per reading example, building no task it does not train."""
        tasks = {task for task, _ in self.weights}
        return replace(
            worlds,
            reading_docs=self.reading_docs,
            unanswerable=self.unanswerable,
            reading_per_world=worlds.reading_per_world if "subanswer" in tasks else 0,
            subquery_questions_per_world=worlds.subquery_questions_per_world if "subquery" in tasks else 0,
            final_per_world=worlds.final_per_world if "final" in tasks else 0,
        )


@dataclass(frozen=True)
class WarmTrainConfig:
    """The warm start's training: pretraining, a curriculum with one passage per reading example,
    reading from five passages alone, the answer phase, then all three calls with five passages per
    reading example.

    Reading from one passage is what gets a model trained from scratch over the plateau where it
    picks a name of the right kind without copying it (see docs/toy-study.md).

    Pretraining (skipped when `pretrain_steps` is 0) trains on every token of one-passage reading
    and call A examples, prompt included, as a language model is pretrained on text. That is what
    taught a two-layer model to copy an intermediate answer into the next sub-query; with the
    completion alone as the target, no two-layer schedule here ever learned it, nor with every token
    of call A alone. Pretraining does not teach reading (the answer is one token of hundreds), so
    the curriculum follows, at `tuning_learning_rate`: at the pretraining rate it undoes the copy
    within a few hundred steps (docs/toy-study.md).

    Then, both at `final_learning_rate`: reading from five passages alone for `passage_steps`, and the
    answer phase for `final_steps`, the final answer call with reading kept in half of its batches
    (`final_mixture`). Mixed with the other calls from the start (30-50% of batches, up to 3,500
    steps), a two-layer model never left the plateau where it names an entity of the right kind
    without reading the chain; alone, it left it in some runs and not in others. Reading and call C
    both find a name in the context and copy it: after reading alone, the answer phase learns call C
    faster, and with reading kept in it, both leave their plateaus early in the mixed phase, which
    then brings back call A (docs/toy-study.md).
    """

    pretrain_steps: int = 3000
    pretrain_mixture: tuple[tuple[str, float], ...] = (("subanswer", 0.5), ("subquery", 0.5))
    reading_steps: int = 2000  # the curriculum's steps
    passage_steps: int = 300  # reading from five passages alone
    final_steps: int = 400  # the answer phase
    final_mixture: tuple[tuple[str, float], ...] = (("final", 0.5), ("subanswer", 0.5))
    final_learning_rate: float = 1e-3
    mixed_steps: int = 3000
    curriculum: tuple[tuple[str, float], ...] = (("subanswer", 0.5), ("subquery", 0.5))
    mixture: tuple[tuple[str, float], ...] = (("subanswer", 0.3), ("subquery", 0.4), ("final", 0.3))
    prompt_loss: tuple[str, ...] = ("subquery",)  # tasks trained on every token after pretraining too
    unanswerable: float = 0.0  # the mixed phase's reading examples without the fact's passage
    reading_batch_tokens: int = 2304  # padded tokens per batch with one passage: ~16 prompts
    batch_tokens: int = 4608  # padded tokens per batch of the mixed phase: ~16 five-passage prompts
    learning_rate: float = 2e-3  # pretraining's peak
    tuning_learning_rate: float = 5e-4  # the peak of the curriculum and the mixed phase
    warmup_steps: int = 50
    seed: int = 0
    compile: bool = False  # torch.compile the transformer body: 8-17% faster by phase, compiling included

    def phases(self) -> list[WarmPhase]:
        pretrain_tasks = tuple(task for task, _ in self.pretrain_mixture)
        phases = [
            WarmPhase(
                self.pretrain_steps,
                self.reading_batch_tokens,
                (1,),
                self.pretrain_mixture,
                self.learning_rate,
                pretrain_tasks,
            ),
            WarmPhase(
                self.reading_steps,
                self.reading_batch_tokens,
                (1,),
                self.curriculum,
                self.tuning_learning_rate,
                self.prompt_loss,
            ),
            WarmPhase(
                self.passage_steps, self.batch_tokens, (5,), (("subanswer", 1.0),), self.final_learning_rate
            ),
            WarmPhase(
                self.final_steps, self.batch_tokens, (5,), self.final_mixture, self.final_learning_rate
            ),
            WarmPhase(
                self.mixed_steps,
                self.batch_tokens,
                (5,),
                self.mixture,
                self.tuning_learning_rate,
                self.prompt_loss,
                self.unanswerable,
            ),
        ]
        return [phase for phase in phases if phase.steps > 0]


class ExampleStream:
    """Tokenized warm-start examples by task, drawn from fresh worlds as they are needed.

    Labels cover the completion, or every token for the tasks in `prompt_loss`.
    """

    def __init__(
        self,
        tokenizer: Any,
        world_seeds: Iterator[int],
        config: WarmStartConfig,
        max_queue: int = 2048,
        prompt_loss: Collection[str] = (),
    ) -> None:
        self.tokenizer, self.world_seeds, self.config = tokenizer, world_seeds, config
        self.prompt_loss = set(prompt_loss)
        self.max_queue = max_queue  # a task drawn rarely does not pile up examples of the others
        self.queues: dict[str, deque[tuple[list[int], list[int]]]] = {}

    def _next(self, task: str) -> tuple[list[int], list[int]]:
        """The next example of `task` (left in the queue)."""
        while not self.queues.get(task):
            for ex in world_examples(next(self.world_seeds), self.config):
                queue = self.queues.setdefault(ex["task"], deque())
                if len(queue) < self.max_queue:
                    encoded = tokenize_example(self.tokenizer, ex["prompt"], ex["completion"])
                    ids = encoded["input_ids"]
                    queue.append((ids, ids if ex["task"] in self.prompt_loss else encoded["labels"]))
        return self.queues[task][0]

    def take(self, task: str, n: int) -> list[tuple[list[int], list[int]]]:
        """The next `n` examples of `task`."""
        out = []
        for _ in range(n):
            out.append(self._next(task))
            self.queues[task].popleft()
        return out

    def take_tokens(self, task: str, budget: int) -> list[tuple[list[int], list[int]]]:
        """The next examples of `task` whose padded batch fits `budget` tokens (at least one)."""
        batch = self.take(task, 1)
        width = len(batch[0][0])
        while (len(batch) + 1) * max(width, len(self._next(task)[0])) <= budget:
            batch += self.take(task, 1)
            width = max(width, len(batch[-1][0]))
        return batch


def completion_loss(
    model: Any, batch: Sequence[tuple[list[int], list[int]]], pad_id: int, body: Any = None
) -> Any:
    """Mean cross-entropy over labelled tokens, with the output layer applied only where a label is
    (prompts are most of every sequence, so this is about half the cost of full logits).

    `body` runs the transformer in place of `model.base_model` (its compiled form, say)."""
    import torch
    import torch.nn.functional as F

    width = max(len(ids) for ids, _ in batch)
    ids = torch.tensor([x + [pad_id] * (width - len(x)) for x, _ in batch])
    labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in batch])
    mask = (torch.arange(width)[None] < torch.tensor([len(x) for x, _ in batch])[:, None]).long()
    logits, targets = _labelled_logits(model, ids, labels, mask, body)
    return F.cross_entropy(logits.float(), targets)


def _labelled_logits(
    model: Any, ids: Any, labels: Any, mask: Any = None, body: Any = None
) -> tuple[Any, Any]:
    """Next-token logits at the labelled positions only, and their targets."""
    body = model.base_model if body is None else body
    hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
    targets = labels[:, 1:]
    keep = targets != -100
    return model.get_output_embeddings()(hidden[keep]), targets[keep]


def learning_rate(step: int, phase: WarmPhase, warmup_steps: int) -> float:
    """Linear warm-up to the phase's peak, then cosine decay to a tenth (restarted in each phase)."""
    warm = min(1.0, (step + 1) / warmup_steps)
    return phase.learning_rate * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * step / max(1, phase.steps))))


def train_warm_start(
    model: Any,
    tokenizer: Any,
    config: WarmTrainConfig = WarmTrainConfig(),
    worlds: WarmStartConfig = WarmStartConfig(),
    exclude: Collection[int] = (),
) -> dict[str, Any]:
    """Train `model` in place on fresh worlds, phase after phase; returns the loss log.

    A plain PyTorch loop rather than the SFT recipe: the warm start plays pretraining, and examples
    are generated as it goes (never repeated, so nothing can be memorised).
    """
    import torch

    torch.manual_seed(config.seed)
    rng = random.Random(f"warm-train|{config.seed}")
    seeds = iter_fresh_seeds(config.seed, exclude)
    optimiser = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, betas=(0.9, 0.98), weight_decay=0.0
    )
    log: dict[str, Any] = {"phases": []}
    model.train()
    # Shapes change with every batch, so compile for dynamic shapes once rather than per shape.
    body = torch.compile(model.base_model, dynamic=True) if config.compile else model.base_model
    phases = config.phases()
    for number, phase in enumerate(phases, 1):
        stream = ExampleStream(tokenizer, seeds, phase.world_config(worlds), prompt_loss=phase.prompt_loss)
        tasks, weights = zip(*phase.weights, strict=True)
        recent: dict[str, list[float]] = {t: [] for t in tasks}
        desc = f"warm start {number}/{len(phases)}"
        bar = tqdm(range(phase.steps), desc=desc, mininterval=5)
        for step in bar:
            task = rng.choices(tasks, weights)[0]
            batch = stream.take_tokens(task, phase.batch_tokens)
            for group in optimiser.param_groups:
                group["lr"] = learning_rate(step, phase, config.warmup_steps)
            loss = completion_loss(model, batch, tokenizer.pad_token_id, body)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimiser.step()
            recent[task] = (recent[task] + [loss.item()])[-50:]
            if step % 50 == 0:
                bar.set_postfix({t: f"{sum(v) / len(v):.2f}" for t, v in recent.items() if v})
        log["phases"].append({
            "steps": phase.steps,
            "reading_docs": list(phase.reading_docs),
            "learning_rate": phase.learning_rate,
            "prompt_loss": list(phase.prompt_loss),
            "final_loss": {t: round(sum(v) / len(v), 4) for t, v in recent.items() if v},
        })  # fmt: skip
    model.eval()
    return log


def teacher_forced_correct(model: Any, tokenizer: Any, ex: dict[str, Any]) -> bool:
    """Whether every target token of a prompt/completion example (and the end of turn) is the model's
    top choice given the gold tokens before it: greedy decoding would write exactly the target."""
    import torch

    encoded = tokenize_example(tokenizer, ex["prompt"], ex["completion"])
    ids, labels = (torch.tensor([encoded[k]]) for k in ("input_ids", "labels"))
    with torch.inference_mode():
        logits, targets = _labelled_logits(model, ids, labels)
    return bool((logits.argmax(-1) == targets).all())


def heldout_accuracy(
    model: Any, tokenizer: Any, worlds: WarmStartConfig, seed: int, per_task: int = 100
) -> dict[str, float]:
    """Teacher-forced exact match by task on fresh worlds never trained on: the share of examples
    whose every target token (and end of turn) is the model's top choice.

    Call A is also split by step: `subquery_first` (the subject is copied from the main query) and
    `subquery_later` (the latest intermediate answer must be copied into the new sub-query). Call C is
    scored on multi-hop chains only (`worlds.hops`), the one-hop chains of training left out. Reading
    without the fact's passage is scored apart (`no_info`: the model says "No relevant information
    found"); `subanswer` is reading with it.
    """
    keys_wanted = ("final", "subanswer", "no_info", "subquery", "subquery_first", "subquery_later")
    worlds = replace(worlds, final_hops=worlds.hops, unanswerable=0.5)
    groups: dict[str, list[dict[str, Any]]] = {}
    for world_seed in itertools.islice(iter_fresh_seeds(seed + 7_919_000), 50):
        for ex in world_examples(world_seed, worlds):
            keys = ["no_info" if ex["id"].endswith("/no_info") else ex["task"]]
            if ex["task"] == "subquery":
                keys.append("subquery_first" if ex["id"].endswith("/0") else "subquery_later")
            for key in keys:
                if len(groups.setdefault(key, [])) < per_task:
                    groups[key].append(ex)
        if all(len(groups.get(key, [])) == per_task for key in keys_wanted):
            break
    right: dict[str, bool] = {}  # by example id: a call A example is in two groups, scored once
    for ex in (ex for examples in groups.values() for ex in examples):
        if ex["id"] not in right:
            right[ex["id"]] = teacher_forced_correct(model, tokenizer, ex)
    return {
        key: round(sum(right[ex["id"]] for ex in examples) / len(examples), 3)
        for key, examples in sorted(groups.items())
    }
