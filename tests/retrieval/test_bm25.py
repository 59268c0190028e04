"""BM25: scores follow the Lucene formula, save/load round-trips, toy-world recall, `corag index --kind bm25`."""

from __future__ import annotations

import math

import pytest

from corag.errors import InputError
from corag.retrieval import load_retriever
from corag.retrieval.bm25 import K1, B, BM25Retriever, tokenize
from corag.retrieval.index import main as index_main
from corag.types import Passage

PASSAGES = [
    Passage("10", "Paris", "Paris is the capital and largest city of France."),
    Passage("11", "Lyon", "Lyon is a city in France on the Rhone."),
    Passage("12", "Berlin", "Berlin is the capital of Germany. Berlin has many museums."),
    Passage("13", "Rhone", "The Rhone is a river that flows through Switzerland and France."),
]


def lucene_bm25(query: str, passages: list[Passage], doc: Passage) -> float:
    """BM25 (Lucene variant) written out from its definition."""
    docs = [tokenize(f"{p.title} {p.contents}") for p in passages]
    tokens = tokenize(f"{doc.title} {doc.contents}")
    avgdl = sum(map(len, docs)) / len(docs)
    score = 0.0
    for term in set(tokenize(query)):
        df = sum(term in d for d in docs)
        if df == 0:
            continue
        idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
        tf = tokens.count(term)
        score += idf * tf / (tf + K1 * (1 - B + B * len(tokens) / avgdl))
    return score


def test_scores_match_the_lucene_formula_and_rank_by_score():
    r = BM25Retriever.from_passages(PASSAGES)
    for query in ["capital of France", "Berlin museums", "river Rhone in France"]:
        hits = r.search([query], 4)[0]
        by_id = {p.id: p for p in PASSAGES}
        expected = sorted(
            (
                (lucene_bm25(query, PASSAGES, p), p.id)
                for p in PASSAGES
                if lucene_bm25(query, PASSAGES, p) > 0
            ),
            reverse=True,
        )
        assert [h.doc_id for h in hits] == [i for _, i in expected]
        for h in hits:
            assert h.score == pytest.approx(lucene_bm25(query, PASSAGES, by_id[h.doc_id]), rel=1e-5)


def test_batched_search_equals_one_query_at_a_time_and_edge_cases():
    r = BM25Retriever.from_passages(PASSAGES)
    queries = ["capital", "Rhone river", "Germany", "the of and", "zzz unknown", ""]
    batched = r.search(queries, 2)
    assert batched == [r.search([q], 2)[0] for q in queries]
    assert batched[3] == [] and batched[4] == [] and batched[5] == []  # stopwords / unknown / empty
    assert all(len(h) <= 2 for h in batched)
    assert len(r.search(["France"], 100)[0]) == 3  # k beyond the corpus: every matching passage
    assert r.search([], 5) == [] and r.search(["France"], 0) == [[]]


def test_save_load_round_trip_and_replace(tmp_path):
    r = BM25Retriever.from_passages(PASSAGES)
    folder = tmp_path / "bm25"
    r.save(folder)
    queries = ["capital of France", "Berlin", "Rhone"]
    loaded = load_retriever(folder)
    assert isinstance(loaded, BM25Retriever)
    assert loaded.search(queries, 3) == r.search(queries, 3)
    # saving over an existing index swaps it whole, leaving no temporary folders behind
    BM25Retriever.from_passages(PASSAGES[:2]).save(folder)
    assert load_retriever(folder).search(["Berlin"], 3) == [[]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bm25"]


def test_load_rejects_folders_that_are_not_bm25_indexes(tmp_path):
    with pytest.raises(InputError, match="manifest.json"):
        BM25Retriever.load(tmp_path)
    with pytest.raises(InputError, match="empty corpus"):
        BM25Retriever.from_passages([])


def test_toy_world_single_hop_recall(toy_world):
    r = BM25Retriever.from_passages(toy_world.passages)
    questions = toy_world.single_hop
    hits = r.search([q.query for q in questions], 5)
    recall = sum(q.supporting_ids[0] in {h.doc_id for h in hs} for q, hs in zip(questions, hits, strict=True))
    assert recall / len(questions) >= 0.9


def test_index_command_builds_bm25_from_a_corpus_file(toy_dir, toy_world, tmp_path, capsys):
    out = tmp_path / "idx"
    assert index_main([str(toy_dir / "corpus.jsonl"), "--out", str(out), "--kind", "bm25"]) == 0
    assert "written to" in capsys.readouterr().out
    r = load_retriever(out)
    direct = BM25Retriever.from_passages(toy_world.passages)
    queries = [q.query for q in toy_world.test[:10]]
    assert r.search(queries, 5) == direct.search(queries, 5)
    with pytest.raises(InputError, match="--overwrite"):
        index_main([str(toy_dir / "corpus.jsonl"), "--out", str(out), "--kind", "bm25"])
