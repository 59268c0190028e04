"""Warm-start examples: exact CoRAG calls, readable targets, fresh worlds, determinism."""

from __future__ import annotations

import json
import random
import re

import pytest

from corag import prompts
from corag.data.toyworld import generate_world
from corag.retrieval.bm25 import BM25Retriever
from corag.warmstart import (
    WarmStartConfig,
    final_examples,
    fresh_seeds,
    iter_examples,
    main,
    reading_examples,
    subquery_examples,
    world_examples,
)

CONFIG = WarmStartConfig(
    reading_per_world=60,
    subquery_questions_per_world=8,
    final_per_world=6,
    reading_docs=(1, 3, 5),
    num_entities=60,
    num_distractors=15,
)
SINGLE_HOP = re.compile(r"^(Who|What) is the (\w+) of (.+)\?$")


@pytest.fixture(scope="module")
def world():
    return generate_world(seed=12345, num_entities=60, num_distractors=15, train_per_hop=10, test_per_hop=2)


@pytest.fixture(scope="module")
def retriever(world):
    return BM25Retriever.from_passages(world.passages)


def _shown_passages(content: str) -> list[str]:
    """The documents block of a call-B prompt, split back into passages (title line, contents line)."""
    block = content.split("## Documents\n", 1)[1].split("\n\n## Query\n", 1)[0]
    return block.split("\n\n")


def test_examples_are_well_formed_prompt_completion_pairs():
    examples = list(iter_examples(seed=1, num_worlds=2, config=CONFIG))
    assert {e["task"] for e in examples} == {"subanswer", "subquery", "final"}
    for e in examples:
        assert set(e) == {"prompt", "completion", "task", "id"}
        (user,) = e["prompt"]
        (assistant,) = e["completion"]
        assert user["role"] == "user" and user["content"].strip()
        assert assistant["role"] == "assistant" and assistant["content"].strip()
    assert len({e["id"] for e in examples}) == len(examples)
    json.dumps(examples)  # plain JSON, as trl and the JSONL files need


def test_reading_prompts_are_call_b_over_the_retrievers_top_passages(world, retriever):
    by_id = {p.id: p for p in world.passages}
    facts = {f"{f.id}/subanswer": f for f in world.single_hop}
    examples = reading_examples(world, retriever, random.Random(0), 40, num_docs=(2, 5))
    assert len(examples) >= 35  # nearly every fact's passage is among its top passages
    sizes = set()
    for e in examples:
        fact = facts[e["id"]]
        content = e["prompt"][0]["content"]
        sizes.add(len(_shown_passages(content)))
        hits = retriever.search([fact.query], 5)[0]
        shown = [by_id[h.doc_id] for h in hits][: len(_shown_passages(content))]
        assert e["prompt"] == prompts.subanswer_messages(fact.query, shown)
        assert e["completion"][0]["content"] == fact.answers[0]
    assert sizes == {2, 5}


def test_reading_target_is_stated_in_exactly_one_shown_passage(world, retriever):
    examples = reading_examples(world, retriever, random.Random(1), 60, num_docs=(1, 3, 5))
    for e in examples:
        content = e["prompt"][0]["content"]
        query = content.split("## Query\n", 1)[1].split("\n", 1)[0]
        _, relation, subject = SINGLE_HOP.match(query).groups()
        answer = e["completion"][0]["content"]
        sentence = f"The {relation} of {subject} is {answer}."
        assert sum(sentence in passage for passage in _shown_passages(content)) == 1, e["id"]


def test_subquery_examples_follow_the_gold_chain_in_call_a(world):
    examples = subquery_examples(world, random.Random(0), 6)
    questions = {ex.id: ex for ex in world.train}
    assert examples
    for e in examples:
        qid, _, step = e["id"].rsplit("/", 2)
        ex, i = questions[qid], int(step)
        desc = prompts.task_description("multihopqa")
        assert e["prompt"] == prompts.subquery_messages(ex.query, ex.decomposition[:i], desc)
        target = e["completion"][0]["content"]
        wh, relation, subject = SINGLE_HOP.match(target).groups()
        # The sub-query asks one relation of the seed entity (step 0) or of the previous answer.
        assert subject == (ex.supporting_titles[0] if i == 0 else ex.decomposition[i - 1].subanswer)
        assert f"the {relation} of " in ex.query
    per_question = {e["id"].rsplit("/", 2)[0] for e in examples}
    assert len(examples) == sum(len(questions[q].decomposition) for q in per_question)


def test_a_finished_chain_repeats_its_last_sub_query(world):
    plain = subquery_examples(world, random.Random(0), 6)
    with_repeat = subquery_examples(world, random.Random(0), 6, repeat_when_done=True)
    extra = [e for e in with_repeat if e not in plain]
    assert len(extra) == len({e["id"].rsplit("/", 2)[0] for e in plain}) > 0
    for e in extra:
        content = e["prompt"][0]["content"]
        past = content.split("## Previous intermediate queries and answers\n", 1)[1].split("\n\n", 1)[0]
        last_query = [line for line in past.splitlines() if line.startswith("Intermediate query")][-1]
        assert last_query.split(": ", 1)[1] == e["completion"][0]["content"]
        assert past.count("Intermediate answer") == int(e["id"].rsplit("/", 1)[1])


def test_final_examples_show_the_whole_gold_chain_and_answer_it(world, retriever):
    examples = final_examples(world, retriever, random.Random(0), 8, num_docs=(0, 20))
    questions = {ex.id: ex for ex in world.train}
    with_docs = 0
    for e in examples:
        ex = questions[e["id"].rsplit("/", 1)[0]]
        content = e["prompt"][0]["content"]
        with_docs += "Doc 0: " in content
        for k, step in enumerate(ex.decomposition, start=1):
            assert f"Intermediate answer {k}: {step.subanswer}" in content
        assert content.split("## Main query\n", 1)[1].startswith(ex.query + "\n")
        assert e["completion"][0]["content"] == ex.answers[0] == ex.decomposition[-1].subanswer
    assert 0 < with_docs < len(examples)


def test_fresh_worlds_never_reuse_an_excluded_seed_and_differ_from_the_target():
    first = fresh_seeds(0, 5)
    assert len(set(first)) == 5 and fresh_seeds(0, 5) == first and fresh_seeds(1, 5) != first
    assert first[0] not in fresh_seeds(0, 5, exclude={first[0]})
    target = generate_world(seed=0, num_entities=60, num_distractors=15, train_per_hop=10, test_per_hop=2)
    fresh = generate_world(
        seed=first[0], num_entities=60, num_distractors=15, train_per_hop=10, test_per_hop=2
    )
    shared = {p.contents for p in target.passages} & {p.contents for p in fresh.passages}
    assert len(shared) <= 1  # names are new combinations of pool words, so facts are new
    ids = {e["id"].split("-", 1)[0] for e in world_examples(first[0], CONFIG)}
    assert ids == {f"toy{first[0]}"}


def test_same_seed_gives_the_same_examples_and_another_seed_differs():
    a = list(iter_examples(seed=3, num_worlds=1, config=CONFIG))
    b = list(iter_examples(seed=3, num_worlds=1, config=CONFIG))
    c = list(iter_examples(seed=4, num_worlds=1, config=CONFIG))
    assert a == b
    assert [e["completion"] for e in a] != [e["completion"] for e in c]


def test_main_writes_jsonl(tmp_path, capsys):
    out = tmp_path / "warm.jsonl"
    args = ["--out", str(out), "--seed", "2", "--worlds", "1", "--reading-per-world", "20"]
    args += ["--subquery-questions-per-world", "3", "--final-per-world", "2", "--exclude", "0", "1"]
    assert main(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(r["task"] == "subanswer" for r in rows) >= 18
    assert str(out) in capsys.readouterr().out
