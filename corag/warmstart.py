"""Warm-start examples for a tiny model trained from scratch on the toy world.

The paper starts from an instruct model that can already read a passage and ask a follow-up question.
A tiny model built from config can do neither, so before rejection sampling it is taught the three
CoRAG calls on freshly generated toy worlds (never the target world), in the exact CoRAG prompts:

- reading (call B): a single-hop sub-query and the top passages a BM25 retriever returns for it in that
  world (hard negatives that share the subject's name-word or the relation), target the answer;
- decomposition (call A): the gold steps so far of a multi-hop question, target the next gold sub-query;
- final answer (call C): the gold chain and the question's top-20 passages (or none), target the answer.

Names in a fresh world are new combinations of the shared name pool, so facts cannot be memorised: the
only way to fit the examples is to read and copy. Everything is fixed by the seed.

Examples are conversational prompt/completion dicts (as corag.training writes them), which trl consumes:
`{"prompt": [user], "completion": [assistant], "task": "subanswer"|"subquery"|"final", "id": ...}`.
"""

from __future__ import annotations

import argparse
import hashlib
import random
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from corag import prompts
from corag.data.toyworld import ToyWorld, fact_sentence, generate_world
from corag.retrieval.bm25 import BM25Retriever
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
    final_per_world: int = 20  # call C examples (gold chains)
    reading_docs: tuple[int, ...] = (5,)  # passages shown per reading example, drawn uniformly from these
    final_docs: tuple[int, ...] = (0, 20)  # passages shown per final example, drawn uniformly from these
    num_entities: int = 300
    num_distractors: int = 60
    hops: tuple[int, ...] = (2, 3, 4)


def fresh_seeds(seed: int, count: int, exclude: Collection[int] = ()) -> list[int]:
    """`count` distinct world seeds fixed by `seed`, none in `exclude` (the target worlds' seeds)."""
    seeds: list[int] = []
    index = 0
    while len(seeds) < count:
        digest = hashlib.blake2b(f"warmstart|{seed}|{index}".encode(), digest_size=8).digest()
        candidate = FRESH_SEED_MIN + int.from_bytes(digest, "big") % (2**31 - FRESH_SEED_MIN)
        index += 1
        if candidate not in exclude and candidate not in seeds:
            seeds.append(candidate)
    return seeds


def fresh_world(world_seed: int, config: WarmStartConfig) -> ToyWorld:
    """A fresh world of the configured sizes; its questions are only a source of gold chains."""
    n = max(config.subquery_questions_per_world, config.final_per_world)
    return generate_world(
        seed=world_seed,
        num_entities=config.num_entities,
        num_distractors=config.num_distractors,
        train_per_hop=n,
        test_per_hop=1,
        hops=config.hops,
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
) -> list[dict[str, Any]]:
    """Call B examples: a single-hop fact's sub-query over its top BM25 passages, target the answer.

    Only facts whose passage is among the passages shown are used (with BM25 on the toy world that is
    nearly every fact), so the answer can always be read: it appears in exactly one shown passage as
    `The <relation> of <subject> is <answer>.`
    """
    facts = rng.sample(world.single_hop, min(count, len(world.single_hop)))
    sizes = [rng.choice(num_docs) for _ in facts]
    by_id = {p.id: p for p in world.passages}
    shown = _search(retriever, by_id, [f.query for f in facts], max(num_docs))
    out = []
    for fact, size, passages in zip(facts, sizes, shown, strict=True):
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


def subquery_examples(
    world: ToyWorld, rng: random.Random, questions: int, repeat_when_done: bool = False
) -> list[dict[str, Any]]:
    """Call A examples: for each step i of a gold decomposition, the steps before i -> sub-query i.

    With `repeat_when_done`, the finished chain -> its last sub-query again. Decoding discards a repeated
    sub-query and retries, so a model that repeats once it is done ends its chain with the gold steps
    instead of adding steps that the final answer would have to look past.
    """
    out = []
    for ex in rng.sample(world.train, min(questions, len(world.train))):
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
) -> list[dict[str, Any]]:
    """Call C examples: the whole gold chain (and the question's top passages), target the answer."""
    chosen = rng.sample(world.train, min(count, len(world.train)))
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
    out = reading_examples(world, retriever, rng, config.reading_per_world, config.reading_docs)
    out += subquery_examples(world, rng, config.subquery_questions_per_world, config.repeat_when_done)
    out += final_examples(world, retriever, rng, config.final_per_world, config.final_docs)
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


def main(argv: list[str] | None = None) -> int:
    """`corag warmstart --out FILE --seed N --worlds W`: write warm-start examples as JSONL."""
    from corag.data.jsonl import write_jsonl

    parser = argparse.ArgumentParser(prog="corag warmstart", description=main.__doc__)
    parser.add_argument("--out", required=True, help="output JSONL (prompt/completion examples)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worlds", type=int, default=50, help="fresh worlds to draw examples from")
    parser.add_argument("--exclude", type=int, nargs="*", default=[], help="world seeds never to use")
    parser.add_argument("--reading-per-world", type=int, default=WarmStartConfig.reading_per_world)
    parser.add_argument(
        "--subquery-questions-per-world", type=int, default=WarmStartConfig.subquery_questions_per_world
    )
    parser.add_argument("--final-per-world", type=int, default=WarmStartConfig.final_per_world)
    args = parser.parse_args(argv)
    config = WarmStartConfig(
        reading_per_world=args.reading_per_world,
        subquery_questions_per_world=args.subquery_questions_per_world,
        final_per_world=args.final_per_world,
    )
    examples = list(iter_examples(args.seed, args.worlds, config, set(args.exclude)))
    write_jsonl(args.out, examples)
    out = args.out
    counts = {task: sum(e["task"] == task for e in examples) for task in ("subanswer", "subquery", "final")}
    print(f"wrote {len(examples)} warm-start examples {counts} to {out}")
    return 0
