"""The toy world: determinism, held-out split, gold decompositions that the passages support."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from corag.toy.world import RELATIONS, generate_world, name_pool, phrasing_texts, tokenizer_texts

SIZES = dict(num_entities=80, num_distractors=20, train_per_hop=30, test_per_hop=10)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_same_seed_writes_identical_bytes_and_another_seed_differs(tmp_path):
    a = generate_world(seed=3, **SIZES).write(tmp_path / "a")
    b = generate_world(seed=3, **SIZES).write(tmp_path / "b")
    c = generate_world(seed=4, **SIZES).write(tmp_path / "c")
    assert {"corpus.jsonl", "train.jsonl", "test.jsonl"} <= set(_files(a))
    assert _files(a) == _files(b)
    for name in ("corpus.jsonl", "train.jsonl", "test.jsonl"):
        assert _files(a)[name] != _files(c)[name]
    assert not list(a.glob(".*.tmp"))  # no temporary files left behind


def test_world_does_not_depend_on_the_process_hash_seed(tmp_path):
    # String hashing differs per process; nothing in the world may depend on set or hash order.
    script = (
        "import sys; from corag.toy.world import generate_world; "
        "generate_world(seed=7, num_entities=60, num_distractors=10, train_per_hop=10, test_per_hop=5)"
        ".write(sys.argv[1])"
    )
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run([sys.executable, "-c", script, str(tmp_path / hash_seed)], check=True, env=env)
    assert _files(tmp_path / "1") == _files(tmp_path / "2")


def test_written_files_use_the_plain_formats(toy_dir, toy_world):
    corpus = [json.loads(line) for line in (toy_dir / "corpus.jsonl").read_text().splitlines()]
    assert all(set(r) == {"id", "title", "contents"} and isinstance(r["id"], str) for r in corpus)
    assert len({r["id"] for r in corpus}) == len(corpus)
    for split in ("train", "test", "single_hop"):
        records = [json.loads(line) for line in (toy_dir / f"{split}.jsonl").read_text().splitlines()]
        assert records, split
        for r in records:
            assert isinstance(r["id"], str) and r["query"].endswith("?") and r["answers"]
            assert all(set(s) == {"subquery", "subanswer", "doc_ids"} for s in r["decomposition"])
    ids = [json.loads(line)["id"] for line in (toy_dir / "train.jsonl").read_text().splitlines()]
    assert len(set(ids)) == len(ids)


def test_written_questions_load_with_the_project_loader(toy_dir):
    formats = pytest.importorskip("corag.data.formats")
    examples = formats.load_examples(toy_dir / "test.jsonl", fmt="jsonl")
    assert examples and all(ex.decomposition and ex.answers for ex in examples)


def _chain_entities(ex, titles: dict[str, str]) -> set[str]:
    """Names of every entity a question's gold chain touches, read from its decomposition."""
    return {titles[ex.decomposition[0].doc_ids[0]]} | {s.subanswer for s in ex.decomposition}


def test_test_question_entities_never_appear_in_train_questions(toy_world):
    titles = {p.id: p.title for p in toy_world.passages}
    train_entities = set().union(*(_chain_entities(ex, titles) for ex in toy_world.train))
    test_entities = set().union(*(_chain_entities(ex, titles) for ex in toy_world.test))
    assert train_entities and test_entities
    assert not train_entities & test_entities
    # Names are whole entities: no test entity is named inside any train question either.
    train_text = "\n".join(
        ex.query + " " + " ".join(s.subquery for s in ex.decomposition) for ex in toy_world.train
    )
    assert not [name for name in test_entities if f" of {name}?" in train_text]


def test_every_step_is_supported_by_its_passage(toy_world):
    passages = {p.id: p for p in toy_world.passages}
    for ex in [*toy_world.train, *toy_world.test, *toy_world.single_hop]:
        for step in ex.decomposition:
            (doc_id,) = step.doc_ids
            text = passages[doc_id].contents
            # The sub-query's key phrase `the R of X` and its answer sit in one sentence of the passage.
            key = re.fullmatch(r"(?:Who|What) is (the \w+ of .+)\?", step.subquery).group(1)
            assert f"{key[0].upper()}{key[1:]} is {step.subanswer}." in text, (ex.id, step)


def test_hops_answers_and_support_agree(toy_world):
    for ex in [*toy_world.train, *toy_world.test]:
        hops = ex.meta["hops"]
        assert len(ex.decomposition) == hops == ex.query.count(" of ")
        assert ex.answers[0] == ex.decomposition[-1].subanswer
        assert list(ex.supporting_ids) == [s.doc_ids[0] for s in ex.decomposition]
        # Each sub-answer is the entity the next sub-query asks about.
        for prev, nxt in zip(ex.decomposition, ex.decomposition[1:], strict=False):
            assert nxt.subquery.endswith(f" of {prev.subanswer}?")
    counts = Counter((ex.meta["split"], ex.meta["hops"]) for ex in [*toy_world.train, *toy_world.test])
    assert counts == {(s, h): n for s, n in (("train", 30), ("test", 10)) for h in (2, 3, 4)}


def test_multi_hop_questions_contain_each_sub_query_phrase(toy_world):
    for ex in toy_world.test:
        first = ex.decomposition[0].subquery
        assert re.fullmatch(r"(?:Who|What) is (the \w+ of .+)\?", first).group(1) in ex.query
        relations = re.findall(r"the (\w+) of", ex.query)
        assert list(reversed(relations)) == [
            re.search(r"the (\w+) of", s.subquery).group(1) for s in ex.decomposition
        ]


def test_single_hop_questions_cover_every_fact_once(toy_world):
    asked = Counter((ex.supporting_ids[0], ex.meta["relations"][0]) for ex in toy_world.single_hop)
    assert set(asked) == set(toy_world.facts) and set(asked.values()) == {1}
    assert len({ex.query for ex in toy_world.single_hop}) == len(toy_world.single_hop)


def test_names_are_unique_and_drawn_from_the_shared_pool(toy_world):
    pool = set(name_pool())
    assert len(pool) == 1000 and name_pool() == name_pool()
    names = [e.name for e in toy_world.entities]
    assert len(set(names)) == len(names)
    assert all(word in pool for name in names for word in name.split())
    # Another world uses the same pool but other combinations.
    other = {e.name for e in generate_world(seed=1, **SIZES).entities}
    assert other != set(names) and all(w in pool for n in other for w in n.split())


def test_distractors_share_a_name_word_and_never_appear_in_questions(toy_world):
    distractors = [e for e in toy_world.entities if e.part == "distractor"]
    assert distractors
    real_words = {w for e in toy_world.entities if e.part != "distractor" for w in e.name.split()}
    assert all(set(d.name.split()) & real_words for d in distractors)
    used = {doc for ex in [*toy_world.train, *toy_world.test] for doc in ex.supporting_ids}
    assert used and not used & {d.id for d in distractors}


def test_tokenizer_texts_cover_the_pool_phrasings_and_prompts(toy_world):
    text = "\n".join(tokenizer_texts(toy_world))
    assert all(word in text for word in name_pool())
    assert all(f"the {r} of" in text for r in RELATIONS)
    assert "## Documents" in text and "answer multi-hop questions" in text
    assert all(p.contents in text for p in toy_world.passages)
    assert phrasing_texts()[0] in text


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="num_entities"):
        generate_world(num_entities=5)
    with pytest.raises(ValueError, match="hops"):
        generate_world(hops=(0, 2))
    with pytest.raises(ValueError, match="test_fraction"):
        generate_world(test_fraction=1.0)


def test_single_hop_questions_share_distinctive_words_with_their_passage(toy_world):
    # A cheap retrieval sanity check: the subject's name words appear in the gold passage's title.
    titles = {p.id: p.title for p in toy_world.passages}
    for ex in toy_world.single_hop:
        title = titles[ex.supporting_ids[0]]
        assert f" of {title}?" in ex.query
