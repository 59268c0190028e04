"""BM25: scores follow the Lucene formula and equal bm25s's own build, the streamed build is the same
whatever its bucketing, folders load memory-mapped, toy-world recall, `corag index --kind bm25`."""

from __future__ import annotations

import math
import random

import bm25s
import numpy as np
import pytest

from corag.commands.index import main as index_main
from corag.errors import InputError
from corag.retrieval import bm25 as bm25_module
from corag.retrieval import load_retriever
from corag.retrieval.bm25 import K1, B, BM25Retriever, build_bm25_folder, tokenize
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


def test_folder_round_trip_memory_mapped_and_replace(tmp_path):
    r = BM25Retriever.from_passages(PASSAGES)
    folder = tmp_path / "bm25"
    build_bm25_folder([PASSAGES[:3], PASSAGES[3:]], folder)
    queries = ["capital of France", "Berlin", "Rhone"]
    loaded = load_retriever(folder)
    assert isinstance(loaded, BM25Retriever)
    assert isinstance(loaded.model.scores["data"], np.memmap)  # read from disk, not loaded
    assert loaded.search(queries, 3) == r.search(queries, 3)
    # building over an existing index swaps it whole, leaving no temporary folders behind
    build_bm25_folder([PASSAGES[:2]], folder)
    assert load_retriever(folder).search(["Berlin"], 3) == [[]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bm25"]


def random_corpus(seed: int, n: int) -> list[Passage]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(400)]
    return [
        Passage(
            f"p{i}",
            f"title {rng.choice(words)}",
            " ".join(rng.choices(words[: rng.randint(5, 400)], k=rng.randint(0, 60))),
        )
        for i in range(n)
    ]


def test_streamed_build_equals_bm25s_index_for_any_bucketing(tmp_path, monkeypatch):
    passages = random_corpus(0, 600)
    vocab: dict[str, int] = {}
    docs = [[vocab.setdefault(t, len(vocab)) for t in tokenize(f"{p.title} {p.contents}")] for p in passages]
    reference = bm25s.BM25(k1=K1, b=B)
    reference.index((docs, vocab), show_progress=False)
    rng = random.Random(1)
    queries = [" ".join(rng.choices([f"w{i}" for i in range(420)], k=rng.randint(1, 6))) for _ in range(150)]
    tokens = [[t for t in tokenize(q) if t in reference.vocab_dict] for q in queries]
    rows, scores = reference.retrieve(tokens, k=10, show_progress=False)
    expected = [
        [(passages[r].id, float(s)) for r, s in zip(rr, ss, strict=True) if s > 0]
        for rr, ss in zip(rows.tolist(), scores.tolist(), strict=True)
    ]
    for pairs_per_bucket in (10**9, 997):  # one bucket, or many small ones (an odd size on purpose)
        monkeypatch.setattr(bm25_module, "PAIRS_PER_BUCKET", pairs_per_bucket)
        folder = tmp_path / f"b{pairs_per_bucket}"
        build_bm25_folder([passages[:250], passages[250:]], folder, num_docs=len(passages))
        got = [[(h.doc_id, h.score) for h in hs] for hs in BM25Retriever.load(folder).search(queries, 10)]
        assert got == expected  # same ranking and bit-identical float32 scores
    assert not list(tmp_path.rglob("spill-*"))


def test_row_number_ids_are_not_stored(tmp_path):
    passages = [Passage(str(i), p.title, p.contents) for i, p in enumerate(random_corpus(2, 50))]
    build_bm25_folder([passages], tmp_path / "rows")
    assert not (tmp_path / "rows" / "ids.json").exists()
    hits = BM25Retriever.load(tmp_path / "rows").search([passages[7].contents], 1)[0]
    assert hits[0].doc_id == "7"
    mixed = passages[:10] + [Passage("x", "t", "w1 w2")] + passages[11:]  # differs from row 10 on
    build_bm25_folder([mixed[:5], mixed[5:]], tmp_path / "mixed")
    assert BM25Retriever.load(tmp_path / "mixed").ids == [p.id for p in mixed]


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
    assert r.ids == [p.id for p in toy_world.passages]
    direct = BM25Retriever.from_passages(toy_world.passages)
    queries = [q.query for q in toy_world.test[:10]]
    assert r.search(queries, 5) == direct.search(queries, 5)
    with pytest.raises(InputError, match="--overwrite"):
        index_main([str(toy_dir / "corpus.jsonl"), "--out", str(out), "--kind", "bm25"])
