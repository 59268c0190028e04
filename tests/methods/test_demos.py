"""Demonstrations: the JSONL format, and the builders from MuSiQue and from the toy world."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corag.errors import InputError
from corag.methods.demos import (
    Demonstration,
    DemoParagraph,
    chain_cot,
    demos_from_examples,
    demos_from_musique,
    load_demonstrations,
    step_sentence,
    write_demonstrations,
)
from corag.methods.ircot import extract_answer


def test_round_trip_and_errors(tmp_path: Path) -> None:
    demos = [
        Demonstration("Q1?", "A1", "F. So the answer is: A1.", (DemoParagraph("T", "text", True),)),
        Demonstration("Q2?", "A2", "So the answer is: A2.", ()),
    ]
    path = write_demonstrations(tmp_path / "demos.jsonl", demos)
    assert load_demonstrations(path) == demos
    assert [p.name for p in tmp_path.iterdir()] == ["demos.jsonl"]  # no temporary file left

    good = json.dumps(demos[0].to_json())
    bad_cases = {
        '{"question": "Q", "answer": "A", "cot": "C"}': "paragraphs",
        '{"question": "", "answer": "A", "cot": "C", "paragraphs": []}': "question",
        '{"question": "Q", "answer": "A", "cot": "C", "paragraphs": [{"title": "T"}]}': "paragraphs[0].text",
        '{"question": "Q", "answer": "A", "cot": "C", "paragraphs": [{"title": "T", "text": "x", "gold": 1}]}': (
            "paragraphs[0].gold"
        ),
        "not json": None,
    }
    for line, field in bad_cases.items():
        (tmp_path / "bad.jsonl").write_text(f"{good}\n\n{line}\n")
        with pytest.raises(InputError) as err:
            load_demonstrations(tmp_path / "bad.jsonl")
        assert err.value.line == 3 and err.value.field == field and "bad.jsonl" in str(err.value)


def test_step_sentences() -> None:
    assert (
        step_sentence("Van Hook Township >> capital", "Stanley")
        == "The capital of Van Hook Township is Stanley."
    )
    assert (
        step_sentence("Who is the mayor of Netu?", "Dudrofi Shutil") == "The mayor of Netu is Dudrofi Shutil."
    )
    assert step_sentence("What company did Compaq merge with?", "HP") == (
        'The answer to "What company did Compaq merge with" is HP.'
    )
    cot = chain_cot([("X >> father", "Y.")], "Y.")
    assert cot == "The father of X is Y. So the answer is: Y." and extract_answer(cot) == "Y"


def test_demos_from_real_musique(shared_data: Path) -> None:
    path = shared_data / "musique" / "musique_ans_v1.0_dev_sample.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    demos = demos_from_musique(path, n=15, seed=0)
    assert len(demos) == 15
    by_question = {r["question"]: r for r in records}
    for demo in demos:
        record = by_question[demo.question]
        gold = [p for p in demo.paragraphs if p.gold]
        supporting = {(p["title"], p["paragraph_text"]) for p in record["paragraphs"] if p["is_supporting"]}
        assert {(p.title, p.text) for p in gold} == supporting
        assert 1 <= len(demo.paragraphs) - len(gold) <= 3
        assert extract_answer(demo.cot.split(". ")[-1]) == record["answer"].rstrip(".")
        assert "#" not in demo.cot  # references resolved to the sub-answers
        for step in record["question_decomposition"]:
            assert step["answer"].rstrip(".") in demo.cot
    assert len({len(d.paragraphs) - sum(p.gold for p in d.paragraphs) for d in demos}) > 1


def test_demos_from_the_toy_world(toy_world, toy_dir: Path, tmp_path: Path) -> None:
    from corag.data.corpus import Corpus
    from corag.retrieval.bm25 import BM25Retriever

    corpus = Corpus.load(toy_dir / "corpus.jsonl", cache_dir=tmp_path)
    retriever = BM25Retriever.from_passages(toy_world.passages)
    demos = demos_from_examples(toy_world.train, corpus, n=5, retriever=retriever, seed=1)
    assert len(demos) == 5
    for demo, example in zip(demos, toy_world.train, strict=False):
        gold_titles = {corpus.get(d).title for s in example.decomposition for d in s.doc_ids}
        assert {p.title for p in demo.paragraphs if p.gold} == gold_titles
        assert 1 <= sum(not p.gold for p in demo.paragraphs) <= 3
        assert demo.question == example.query
        assert extract_answer(demo.cot.split(". ")[-1]) == example.answers[0]
        for step in example.decomposition:
            assert step.subanswer in demo.cot
    # without a retriever, distractors are random passages; still never a gold one
    for demo, example in zip(
        demos_from_examples(toy_world.train, corpus, n=5, seed=2), toy_world.train, strict=False
    ):
        gold_ids = {d for s in example.decomposition for d in s.doc_ids}
        distractors = [p for p in demo.paragraphs if not p.gold]
        assert 1 <= len(distractors) <= 3
        assert not {p.title for p in distractors} & {corpus.get(d).title for d in gold_ids}


def test_main_writes_loadable_files(shared_data: Path, toy_dir: Path, tmp_path: Path) -> None:
    from corag.commands.demos import main

    musique = shared_data / "musique" / "musique_ans_v1.0_dev_sample.jsonl"
    assert main(["--musique", str(musique), "--out", str(tmp_path / "m.jsonl"), "-n", "4"]) == 0
    assert [d.question for d in load_demonstrations(tmp_path / "m.jsonl")] == [
        d.question for d in demos_from_musique(musique, n=4)
    ]
    assert main(["--toy", str(toy_dir), "--out", str(tmp_path / "t.jsonl"), "-n", "3"]) == 0
    toy = load_demonstrations(tmp_path / "t.jsonl")
    assert len(toy) == 3 and all(any(p.gold for p in d.paragraphs) for d in toy)
