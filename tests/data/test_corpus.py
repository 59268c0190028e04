"""The memory-mapped corpus: JSONL, parquet and datasets sources, id lookup, and the context corpus."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corag.data.corpus import Corpus, corpus_from_contexts, write_corpus_jsonl
from corag.data.formats import load_examples
from corag.data.jsonl import read_jsonl
from corag.errors import InputError
from corag.types import Passage

PASSAGES = [
    Passage("doc-b", "Kuto", "Kuto is a country whose capital is Rira."),
    Passage("doc-a", "Rira", "Rira is a city in Kuto."),
    Passage("x/ü", "Émile", "Émile Zola wrote La Bête Humaine."),
    Passage("10", "Gold", "Gold is a film directed by Ann Lee."),
]


def test_jsonl_corpus_with_string_ids(tmp_path):
    write_corpus_jsonl(tmp_path / "corpus.jsonl", PASSAGES)
    corpus = Corpus.load(tmp_path / "corpus.jsonl")
    assert len(corpus) == 4 and list(corpus.ids) == [p.id for p in PASSAGES]
    assert corpus.ids[-1] == "10" and corpus.ids[1:3] == ["doc-a", "x/ü"]
    assert corpus.get("x/ü") == PASSAGES[2]
    assert corpus.get_many(["10", "doc-b", "10"]) == [PASSAGES[3], PASSAGES[0], PASSAGES[3]]
    assert [p for batch in corpus.iter_batches(3) for p in batch] == PASSAGES
    assert [len(b) for b in corpus.iter_batches(3)] == [3, 1]
    for missing in ("doc-c", "1", "", "doc"):
        with pytest.raises(InputError, match="unknown document id") as err:
            corpus.get(missing)
        assert err.value.record == missing and str(tmp_path / "corpus.jsonl") in str(err.value)


def test_arrow_copy_is_written_once_and_rebuilt_when_the_source_changes(tmp_path):
    source = tmp_path / "corpus.jsonl"
    write_corpus_jsonl(source, PASSAGES)
    Corpus.load(source)
    cached = tmp_path / "corpus.jsonl.arrow"
    first = cached.stat().st_mtime_ns
    assert Corpus.load(source).get("doc-a").title == "Rira"
    assert cached.stat().st_mtime_ns == first  # reused, not rewritten

    write_corpus_jsonl(source, [Passage("doc-a", "Rira", "Rira is the capital of Kuto. (revised)")])
    os.utime(source, ns=(first + 10**9, first + 10**9))
    corpus = Corpus.load(source)
    assert len(corpus) == 1 and corpus.get("doc-a").contents.endswith("(revised)")


def test_cache_dir_is_used_when_given(tmp_path):
    source = tmp_path / "src" / "corpus.jsonl"
    write_corpus_jsonl(source, PASSAGES)
    corpus = Corpus.from_jsonl(source, cache_dir=tmp_path / "cache")
    assert corpus.get("doc-b") == PASSAGES[0]
    assert sorted(p.suffix for p in (tmp_path / "cache").iterdir()) == [".arrow", ".index"]
    assert sorted(p.name for p in (tmp_path / "src").iterdir()) == ["corpus.jsonl"]


def test_reads_are_memory_mapped(tmp_path):
    n = 20_000
    rows = ({"id": f"p{i:05d}", "title": f"T{i}", "contents": "word " * 40 + str(i)} for i in range(n))
    source = tmp_path / "big.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    Corpus.load(source)  # build the Arrow copy and its id index
    size = (tmp_path / "big.jsonl.arrow").stat().st_size
    assert size > 4_000_000

    before = pa.total_allocated_bytes()
    corpus = Corpus.load(source)
    # neither the passages nor the id index were copied into Arrow's heap
    assert pa.total_allocated_bytes() - before < size // 20
    assert corpus.get("p12345").contents.endswith(" 12345")
    assert corpus.ids[n - 1] == "p19999"


def test_parquet_without_id_column_uses_row_numbers(tmp_path):
    table = pa.table({"title": [p.title for p in PASSAGES], "contents": [p.contents for p in PASSAGES]})
    pq.write_table(table, tmp_path / "kilt_like.parquet")
    corpus = Corpus.load(tmp_path / "kilt_like.parquet")
    assert list(corpus.ids) == ["0", "1", "2", "3"]
    assert corpus.get("2") == Passage("2", "Émile", PASSAGES[2].contents)
    assert [p.id for p in corpus.get_many(["3", "0"])] == ["3", "0"]
    for bad in ("4", "02", "-1", "doc-a", "1.0"):
        with pytest.raises(InputError, match="unknown document id"):
            corpus.get(bad)


def test_parquet_with_integer_ids_and_bad_columns(tmp_path):
    pq.write_table(
        pa.table({"id": [5, 7], "title": ["a", "b"], "contents": ["x", "y"]}), tmp_path / "c.parquet"
    )
    corpus = Corpus.load(tmp_path / "c.parquet")
    assert list(corpus.ids) == ["5", "7"] and corpus.get("7") == Passage("7", "b", "y")

    pq.write_table(pa.table({"title": ["a"], "text": ["x"]}), tmp_path / "d.parquet")
    with pytest.raises(InputError, match="no 'contents' column") as err:
        Corpus.load(tmp_path / "d.parquet")
    assert err.value.field == "contents" and err.value.file == str(tmp_path / "d.parquet")

    pq.write_table(pa.table({"title": ["a", "b"], "contents": ["x", None]}), tmp_path / "e.parquet")
    with pytest.raises(InputError, match="null value in row 1"):
        Corpus.load(tmp_path / "e.parquet")


def test_datasets_source_in_memory_and_from_disk(tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict(
        {
            "id": [p.id for p in PASSAGES],
            "title": [p.title for p in PASSAGES],
            "contents": [p.contents for p in PASSAGES],
        }
    )
    corpus = Corpus.from_dataset(ds)
    assert corpus.get("doc-a") == PASSAGES[1] and list(corpus.ids) == [p.id for p in PASSAGES]
    # a selection keeps only its rows, in its order
    picked = Corpus.from_dataset(ds.select([3, 0]))
    assert list(picked.ids) == ["10", "doc-b"] and picked.get("doc-b") == PASSAGES[0]

    no_ids = ds.remove_columns("id")
    no_ids.save_to_disk(str(tmp_path / "saved"))
    loaded = Corpus.load(tmp_path / "saved")
    assert list(loaded.ids) == ["0", "1", "2", "3"] and loaded.get("1").title == "Rira"


def test_ids_equal_to_row_numbers_need_no_index(tmp_path):
    write_corpus_jsonl(tmp_path / "c.jsonl", [Passage(str(i), f"T{i}", f"text {i}") for i in range(5)])
    corpus = Corpus.load(tmp_path / "c.jsonl")
    assert corpus.get("3").contents == "text 3"
    assert not (tmp_path / "c.jsonl.arrow.index").exists()
    with pytest.raises(InputError, match="unknown document id"):
        corpus.get("5")


def test_duplicate_and_malformed_corpus_records(tmp_path):
    write_corpus_jsonl(tmp_path / "dup.jsonl", [*PASSAGES, Passage("doc-a", "Other", "text")])
    with pytest.raises(InputError, match=r"duplicate passage id \(rows 1 and 4\)") as err:
        Corpus.load(tmp_path / "dup.jsonl")
    assert err.value.record == "doc-a" and err.value.field == "id"
    assert not (tmp_path / "dup.jsonl.arrow.index").exists()

    lines = ['{"id": "a", "title": "A", "contents": "x"}', '{"id": "b", "title": "B"}']
    (tmp_path / "missing.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="missing") as err:
        Corpus.load(tmp_path / "missing.jsonl")
    assert (err.value.line, err.value.record, err.value.field) == (2, "b", "contents")
    assert not (tmp_path / "missing.jsonl.arrow").exists()  # nothing half-written

    lines = ['{"title": "A", "contents": "x"}', '{"id": "b", "title": "B", "contents": "y"}']
    (tmp_path / "mixed.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="id present") as err:
        Corpus.load(tmp_path / "mixed.jsonl")
    assert err.value.line == 2

    (tmp_path / "corpus.tsv").write_text("a\tb\n", encoding="utf-8")
    with pytest.raises(InputError, match="unknown corpus suffix"):
        Corpus.load(tmp_path / "corpus.tsv")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=6), min_size=1, max_size=40, unique=True))
def test_any_unique_string_ids_are_found_in_their_rows(ids):
    table = pa.table({"id": ids, "title": [f"t{i}" for i in range(len(ids))], "contents": ids})
    corpus = Corpus(table)
    assert [corpus.row(i) for i in ids] == list(range(len(ids)))
    assert [p.contents for p in corpus.get_many(ids)] == ids


def test_corpus_from_the_real_samples_contexts(shared_data: Path, tmp_path):
    files = [
        "hotpotqa/hotpot_dev_distractor_sample.json",
        "2wikimultihopqa/2wiki_dev_sample.json",
        "musique/musique_ans_v1.0_dev_sample.jsonl",
        "bamboogle/bamboogle.csv",
    ]
    built = corpus_from_contexts([shared_data / f for f in files], tmp_path / "context_corpus.jsonl")

    # independent count of distinct (title, sentences) in the raw files
    hotpot = json.loads((shared_data / files[0]).read_text(encoding="utf-8"))
    wiki = json.loads((shared_data / files[1]).read_text(encoding="utf-8"))
    musique = [json.loads(x) for x in (shared_data / files[2]).read_text(encoding="utf-8").splitlines()]
    raw = {("h", t, "".join(s).strip()) for r in hotpot for t, s in r["context"]}
    raw |= {("w", t, " ".join(s).strip()) for r in wiki for t, s in r["context"]}
    raw |= {("m", p["title"], p["paragraph_text"].strip()) for r in musique for p in r["paragraphs"]}
    distinct = {(t, x) for _, t, x in raw}
    total = sum(len(r["context"]) for r in hotpot + wiki) + sum(len(r["paragraphs"]) for r in musique)
    assert len(built.ids) == len(distinct) < total  # the samples repeat paragraphs; each is kept once

    records = read_jsonl(tmp_path / "context_corpus.jsonl")
    assert [r["id"] for r in records] == [str(i) for i in range(len(records))]
    assert len({(r["title"], r["contents"]) for r in records}) == len(records)

    corpus = Corpus.load(tmp_path / "context_corpus.jsonl")
    assert len(corpus) == len(records)
    examples = {e.id: e for e in built.examples}
    assert len(examples) == 103 + 100 + 120 + 125
    for e in built.examples:
        if e.task == "bamboogle":
            assert e.supporting_ids == ()
            continue
        assert len(e.supporting_ids) >= 2, e.id
        assert {p.title for p in corpus.get_many(e.supporting_ids)} == set(e.supporting_titles), e.id

    # MuSiQue hops point at the paragraph the dataset marks for each step
    raw_by_id = {r["id"]: r for r in musique}
    for e in (x for x in built.examples if x.task == "musique"):
        for step, d in zip(e.decomposition, raw_by_id[e.id]["question_decomposition"], strict=True):
            (doc,) = corpus.get_many(step.doc_ids)
            para = raw_by_id[e.id]["paragraphs"][d["paragraph_support_idx"]]
            assert (doc.title, doc.contents) == (para["title"], para["paragraph_text"].strip())

    hotpot_first = examples["5a8b57f25542995d1e6f1371"]
    assert [p.title for p in corpus.get_many(hotpot_first.supporting_ids)] == ["Scott Derrickson", "Ed Wood"]
    assert built.resolve_titles(["Ed Wood"]) == (hotpot_first.supporting_ids[1],)
    # the loaders leave supporting ids empty: they only exist once a corpus is built
    assert load_examples(shared_data / files[0])[0].supporting_ids == ()
