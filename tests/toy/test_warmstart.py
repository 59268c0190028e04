"""Warm-start examples: exact CoRAG calls, readable targets, fresh worlds, determinism."""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import replace

import pytest
import torch

from corag import prompts
from corag.retrieval.bm25 import BM25Retriever
from corag.toy.warmstart import (
    ExampleStream,
    WarmStartConfig,
    WarmTrainConfig,
    completion_loss,
    final_examples,
    fresh_seeds,
    fresh_world,
    heldout_accuracy,
    iter_examples,
    iter_fresh_seeds,
    reading_examples,
    subquery_examples,
    train_warm_start,
    world_examples,
)
from corag.toy.world import generate_world

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


def test_unanswerable_reading_hides_every_passage_that_states_the_relation(world, retriever):
    examples = reading_examples(world, retriever, random.Random(2), 60, num_docs=(3, 5), unanswerable=0.5)
    hidden = [e for e in examples if e["id"].endswith("/no_info")]
    assert 15 <= len(hidden) <= 45 and len(examples) - len(hidden) >= 15
    by_id = {p.id: p for p in world.passages}
    for e in hidden:
        content = e["prompt"][0]["content"]
        query = content.split("## Query\n", 1)[1].split("\n", 1)[0]
        _, relation, subject = SINGLE_HOP.match(query).groups()
        shown = _shown_passages(content)
        assert len(shown) in (3, 5)
        assert not any(f"The {relation} of {subject} is " in passage for passage in shown), e["id"]
        assert e["completion"][0]["content"] == prompts.NO_INFO
        # the passages are still the retriever's: the next ones after those left out
        hits = [by_id[h.doc_id] for h in retriever.search([query], 8)[0]]
        kept = [p for p in hits if f"The {relation} of {subject} is " not in p.contents][: len(shown)]
        assert e["prompt"] == prompts.subanswer_messages(query, kept)


def test_without_unanswerable_share_every_reading_example_has_an_answer(world, retriever):
    examples = reading_examples(world, retriever, random.Random(2), 60, num_docs=(3, 5))
    assert examples and all(e["completion"][0]["content"] != prompts.NO_INFO for e in examples)


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


def test_one_hop_chains_teach_the_final_answer_but_not_call_a():
    world_seed, config = fresh_seeds(3, 1)[0], replace(CONFIG, final_per_world=20)
    examples = world_examples(world_seed, config)
    hops = {ex.id: ex.meta["hops"] for ex in fresh_world(world_seed, config).train}
    # Ids are <question>/<task>[/<step>]; reading examples come from single-hop facts, not questions.
    hops_of = {e["id"]: hops[e["id"].split("/")[0]] for e in examples if e["task"] != "subanswer"}
    final_hops = {hops_of[e["id"]] for e in examples if e["task"] == "final"}
    call_a_hops = {hops_of[e["id"]] for e in examples if e["task"] == "subquery"}
    assert 1 in final_hops and final_hops <= {1, 2, 3, 4}
    assert call_a_hops and min(call_a_hops) >= 2
    for e in examples:
        if e["task"] == "final" and hops_of[e["id"]] == 1:
            # The one intermediate answer is the answer.
            content = e["prompt"][0]["content"]
            assert f"Intermediate answer 1: {e['completion'][0]['content']}\n" in content
            assert "Intermediate answer 2" not in content


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


# ---------------------------------------------------------------------------------------- training

SMALL_WORLDS = WarmStartConfig(
    reading_per_world=40,
    subquery_questions_per_world=4,
    final_per_world=4,
    num_entities=60,
    num_distractors=15,
)


def test_completion_loss_equals_the_models_own_loss_over_full_logits(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    stream = ExampleStream(tiny_tokenizer, iter_fresh_seeds(5), SMALL_WORLDS)
    batch = stream.take("subanswer", 3) + stream.take("subquery", 2)
    assert len({len(ids) for ids, _ in batch}) > 1  # padding is exercised
    ours = completion_loss(model, batch, tiny_tokenizer.pad_token_id)
    width = max(len(ids) for ids, _ in batch)
    pad = tiny_tokenizer.pad_token_id
    ids = torch.tensor([x + [pad] * (width - len(x)) for x, _ in batch])
    labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in batch])
    mask = (ids != pad).long()
    reference = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert ours.item() == pytest.approx(reference.item(), rel=1e-5)


def test_stream_labels_only_the_target_and_draws_each_task_from_fresh_worlds(tiny_tokenizer):
    stream = ExampleStream(tiny_tokenizer, iter_fresh_seeds(6, exclude={0}), SMALL_WORLDS)
    for task in ("subanswer", "subquery", "final"):
        for ids, labels in stream.take(task, 5):
            target = [t for t in labels if t != -100]
            assert target[-1] == tiny_tokenizer.convert_tokens_to_ids("<|end|>")
            assert ids[-len(target) :] == target
    for budget in (100, 900, 2000):  # a batch fits its padded budget, or is one example
        batch = stream.take_tokens("subanswer", budget)
        assert len(batch) == 1 or len(batch) * max(len(ids) for ids, _ in batch) <= budget
        assert (len(batch) > 1) == (budget > 600)
    again = ExampleStream(tiny_tokenizer, iter_fresh_seeds(6, exclude={0}), SMALL_WORLDS)
    assert again.take("subanswer", 5) == ExampleStream(
        tiny_tokenizer, iter_fresh_seeds(6, exclude={0}), SMALL_WORLDS
    ).take("subanswer", 5)


def test_prompt_loss_labels_every_token_of_its_tasks_only(tiny_tokenizer):
    whole = ExampleStream(tiny_tokenizer, iter_fresh_seeds(7), SMALL_WORLDS, prompt_loss={"subquery"})
    plain = ExampleStream(tiny_tokenizer, iter_fresh_seeds(7), SMALL_WORLDS)
    for (ids, labels), (plain_ids, plain_labels) in zip(
        whole.take("subquery", 4), plain.take("subquery", 4), strict=True
    ):
        assert ids == plain_ids and labels == ids  # same example, now labelled everywhere
        assert plain_labels.count(-100) > len(ids) // 2
    assert whole.take("subanswer", 4) == plain.take("subanswer", 4)  # other tasks unchanged


def test_train_warm_start_lowers_the_loss_and_is_reproducible(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    schedule = WarmTrainConfig(
        pretrain_steps=8,
        reading_steps=12,
        passage_steps=3,
        final_steps=4,
        mixed_steps=6,
        reading_batch_tokens=600,
        batch_tokens=1200,
        tuning_learning_rate=1e-3,
        final_learning_rate=3e-4,
        warmup_steps=2,
        seed=1,
    )
    runs = []
    for _ in range(2):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        stream = ExampleStream(tiny_tokenizer, iter_fresh_seeds(99), SMALL_WORLDS)
        probe = stream.take("subanswer", 8)
        before = completion_loss(model, probe, tiny_tokenizer.pad_token_id).item()
        log = train_warm_start(model, tiny_tokenizer, schedule, SMALL_WORLDS)
        after = completion_loss(model, probe, tiny_tokenizer.pad_token_id).item()
        runs.append((before, after, log, model.state_dict()))
    (before, after, log, weights), (_, after2, log2, weights2) = runs
    assert after < before - 0.5  # a random model's loss on unseen worlds falls
    assert [p["steps"] for p in log["phases"]] == [8, 12, 3, 4, 6]
    assert [p["reading_docs"] for p in log["phases"]] == [[1], [1], [5], [5], [5]]
    assert [p["learning_rate"] for p in log["phases"]] == [2e-3, 1e-3, 3e-4, 3e-4, 1e-3]
    assert [p["prompt_loss"] for p in log["phases"]] == [
        ["subanswer", "subquery"],
        ["subquery"],
        [],
        [],
        ["subquery"],
    ]
    assert set(log["phases"][2]["final_loss"]) == {"subanswer"}  # reading from five passages alone
    assert set(log["phases"][3]["final_loss"]) <= {"final", "subanswer"}  # the answer phase
    assert set(log["phases"][4]["final_loss"]) <= {"subanswer", "subquery", "final"}
    assert after2 == after and log2 == log
    assert all(torch.equal(weights[k], weights2[k]) for k in weights)
    accuracy = heldout_accuracy(model, tiny_tokenizer, SMALL_WORLDS, seed=3, per_task=5)
    assert set(accuracy) == {"subanswer", "no_info", "subquery", "subquery_first", "subquery_later", "final"}
    assert all(0.0 <= v <= 1.0 for v in accuracy.values())


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")), reason="compiling needs a C++ compiler")
def test_compiled_warm_start_trains_like_the_eager_one(tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    # Compiled kernels and precompiled headers stay in tmp_path.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr("torch._inductor.codecache._HEADER_DIR", str(tmp_path / "headers"))
    monkeypatch.setattr("torch._inductor.codecache._HEADER_LOCK_DIR", str(tmp_path / "headers" / "locks"))

    schedule = WarmTrainConfig(
        pretrain_steps=4,
        reading_steps=0,
        passage_steps=0,
        final_steps=3,
        mixed_steps=0,
        batch_tokens=1200,
        seed=2,
    )
    runs = []
    for compiled in (False, True):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        log = train_warm_start(model, tiny_tokenizer, replace(schedule, compile=compiled), SMALL_WORLDS)
        runs.append((log, model.state_dict()))
    (eager_log, eager), (compiled_log, compiled) = runs
    assert not any(k.startswith("_orig_mod") or "._orig_mod." in k for k in compiled)  # saves as usual
    for phase, other in zip(eager_log["phases"], compiled_log["phases"], strict=True):
        for task, loss in phase["final_loss"].items():
            assert other["final_loss"][task] == pytest.approx(loss, rel=1e-3)
    moved = max((eager[k] - compiled[k]).abs().max().item() for k in eager)
    assert moved < 1e-4  # seven steps at lr 2e-3 and 1e-3: the same updates up to rounding


def test_phases_build_only_the_tasks_they_train():
    reading_only = WarmTrainConfig(
        pretrain_steps=0, passage_steps=0, final_steps=0, curriculum=(("subanswer", 1.0),)
    )
    curriculum, mixed = reading_only.phases()  # a phase without steps is left out
    assert curriculum.reading_docs == (1,) and mixed.reading_docs == (5,)
    first = curriculum.world_config(SMALL_WORLDS)
    assert first.reading_per_world > 0 and first.subquery_questions_per_world == first.final_per_world == 0
    second = mixed.world_config(SMALL_WORLDS)
    assert second.reading_per_world and second.subquery_questions_per_world and second.final_per_world
    pretrain, curriculum, passages, final, _ = WarmTrainConfig().phases()
    reading = passages.world_config(SMALL_WORLDS)
    assert reading.reading_docs == (5,) and reading.reading_per_world > 0
    assert reading.subquery_questions_per_world == reading.final_per_world == 0
    answer = final.world_config(SMALL_WORLDS)  # the final answer call, reading kept beside it
    assert answer.final_per_world > 0 and answer.reading_per_world > 0 and answer.reading_docs == (5,)
    assert answer.subquery_questions_per_world == 0
    only = replace(WarmTrainConfig(), final_mixture=(("final", 1.0),)).phases()[3].world_config(SMALL_WORLDS)
    assert only.final_per_world > 0 and only.reading_per_world == only.subquery_questions_per_world == 0
    assert set(pretrain.prompt_loss) == {task for task, _ in pretrain.weights}  # every token of every task
    assert pretrain.learning_rate > curriculum.learning_rate
    built = curriculum.world_config(SMALL_WORLDS)
    assert (
        built.reading_docs == (1,) and built.subquery_questions_per_world > 0 and built.final_per_world == 0
    )
    tasks = {e["task"] for e in world_examples(fresh_seeds(4, 1)[0], built)}
    assert tasks == {"subanswer", "subquery"}
    # only the mixed phase reads without the fact's passage: the plateaus before it are left as they were
    phases = replace(WarmTrainConfig(), unanswerable=0.2).phases()
    assert [p.world_config(SMALL_WORLDS).unanswerable for p in phases] == [0, 0, 0, 0, 0.2]
