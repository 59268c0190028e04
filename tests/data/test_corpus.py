"""The corpus store: JSONL, parquet (file and hub-style folder), Arrow and saved-dataset sources converted
once, lookups by id equal to a plain read of the source, concurrent opens, and the context corpus."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corag.data.corpus import Corpus, corpus_from_contexts, prepare_corpus, write_corpus_jsonl
from corag.data.formats import load_examples
from corag.data.jsonl import read_jsonl, write_jsonl
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
    assert corpus.get("x/ü") == PASSAGES[2] and not corpus.ids_are_rows
    assert corpus.get_many(["10", "doc-b", "10"]) == [PASSAGES[3], PASSAGES[0], PASSAGES[3]]
    assert [p for batch in corpus.iter_batches(3) for p in batch] == PASSAGES
    assert [len(b) for b in corpus.iter_batches(3)] == [3, 1]
    assert [p.id for b in corpus.iter_batches(2, start=1, stop=3) for p in b] == ["doc-a", "x/ü"]
    for missing in ("doc-c", "1", "", "doc"):
        with pytest.raises(InputError, match="unknown document id") as err:
            corpus.get(missing)
        assert err.value.record == missing and str(tmp_path / "corpus.jsonl") in str(err.value)
    # a Corpus travels to worker processes by path
    assert pickle.loads(pickle.dumps(corpus)).get_many(["doc-a"]) == [PASSAGES[1]]


def test_store_is_written_once_and_rebuilt_when_the_source_changes(tmp_path):
    source = tmp_path / "corpus.jsonl"
    write_corpus_jsonl(source, PASSAGES)
    Corpus.load(source)
    store = tmp_path / "corpus.jsonl.corag"
    first = (store / "store.json").stat().st_ino
    assert Corpus.load(source).get("doc-a").title == "Rira"
    assert (store / "store.json").stat().st_ino == first  # reused, not rewritten
    assert Corpus.load(store).get("doc-a").title == "Rira"  # a store opens as it is

    write_corpus_jsonl(source, [Passage("doc-a", "Rira", "Rira is the capital of Kuto. (revised)")])
    corpus = Corpus.load(source)
    assert len(corpus) == 1 and corpus.get("doc-a").contents.endswith("(revised)")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "corpus.jsonl",
        "corpus.jsonl.corag",
        "corpus.jsonl.corag.lock",
    ]


def test_cache_dir_is_used_when_given(tmp_path):
    source = tmp_path / "src" / "corpus.jsonl"
    write_corpus_jsonl(source, PASSAGES)
    corpus = Corpus.load(source, cache_dir=tmp_path / "cache")
    assert corpus.get("doc-b") == PASSAGES[0]
    assert sorted(p.suffix for p in (tmp_path / "cache").iterdir()) == [".corag", ".lock"]
    assert sorted(p.name for p in (tmp_path / "src").iterdir()) == ["corpus.jsonl"]


def random_texts(rng: random.Random, n: int) -> list[str]:
    alphabet = 'abcdé ü\n"ßЖ中 '
    return ["".join(rng.choices(alphabet, k=rng.randint(0, 40))) for _ in range(n)]


def test_hub_parquet_shards_read_like_a_plain_read_of_the_source(tmp_path):
    """Several record batches per file, several files: every lookup equals the source's own row."""
    rng = random.Random(0)
    folder = tmp_path / "kilt-corpus" / "data"
    folder.mkdir(parents=True)
    sizes = [40_000, 1, 25_000]
    for i, size in enumerate(sizes):
        table = pa.table({"title": random_texts(rng, size), "contents": random_texts(rng, size)})
        pq.write_table(table, folder / f"train-{i:05d}-of-{len(sizes):05d}.parquet", row_group_size=7_000)
    plain = pa.concat_tables(
        pq.read_table(folder / f"train-{i:05d}-of-{len(sizes):05d}.parquet") for i in range(len(sizes))
    )
    corpus = Corpus.load(tmp_path / "kilt-corpus")
    assert len(corpus) == plain.num_rows == sum(sizes) and corpus.ids_are_rows
    rows = rng.sample(range(plain.num_rows), 500) + [0, 40_000, plain.num_rows - 1]
    got = corpus.get_many([str(r) for r in rows])
    assert [(p.title, p.contents) for p in got] == [
        (plain["title"][r].as_py(), plain["contents"][r].as_py()) for r in rows
    ]
    batches = list(corpus.iter_batches(9_999, start=39_990, stop=40_010))
    assert [p.contents for b in batches for p in b] == plain["contents"][39_990:40_010].to_pylist()

    (folder / "train-00001-of-00003.parquet").unlink()
    with pytest.raises(InputError, match="shard 00001 of 00003 is missing"):
        Corpus.load(tmp_path / "kilt-corpus", cache_dir=tmp_path / "other")


def test_parquet_without_id_column_uses_row_numbers(tmp_path):
    table = pa.table({"title": [p.title for p in PASSAGES], "contents": [p.contents for p in PASSAGES]})
    pq.write_table(table, tmp_path / "kilt_like.parquet")
    corpus = Corpus.load(tmp_path / "kilt_like.parquet")
    assert list(corpus.ids) == ["0", "1", "2", "3"]
    assert corpus.get("2") == Passage("2", "Émile", PASSAGES[2].contents)
    assert [p.id for p in corpus.get_many(["3", "0"])] == ["3", "0"]
    for bad in ("4", "02", "-1", "doc-a", "1.0", "\u0663"):
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
    assert not list(tmp_path.glob("e.parquet.corag*/"))


def test_saved_datasets_and_arrow_files(tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict(
        {
            "id": [p.id for p in PASSAGES],
            "title": [p.title for p in PASSAGES],
            "contents": [p.contents for p in PASSAGES],
        }
    )
    ds.select([3, 0]).save_to_disk(str(tmp_path / "picked"))
    picked = Corpus.load(tmp_path / "picked")
    assert list(picked.ids) == ["10", "doc-b"] and picked.get("doc-b") == PASSAGES[0]

    no_ids = ds.remove_columns("id")
    datasets.DatasetDict({"train": no_ids}).save_to_disk(str(tmp_path / "saved"))
    loaded = Corpus.load(tmp_path / "saved")
    assert list(loaded.ids) == ["0", "1", "2", "3"] and loaded.get("1").title == "Rira"

    with pa.OSFile(str(tmp_path / "c.arrow"), "wb") as f, pa.ipc.new_file(f, no_ids.data.schema) as w:
        w.write_table(no_ids.data.table)
    assert Corpus.load(tmp_path / "c.arrow").get("3") == Passage("3", "Gold", PASSAGES[3].contents)


def test_ids_equal_to_row_numbers_need_no_id_column(tmp_path):
    write_corpus_jsonl(tmp_path / "c.jsonl", [Passage(str(i), f"T{i}", f"text {i}") for i in range(5)])
    corpus = Corpus.load(tmp_path / "c.jsonl")
    assert corpus.get("3").contents == "text 3" and corpus.ids_are_rows
    assert not list((tmp_path / "c.jsonl.corag").glob("id.*"))
    with pytest.raises(InputError, match="unknown document id"):
        corpus.get("5")


def test_duplicate_and_malformed_corpus_records(tmp_path):
    write_corpus_jsonl(tmp_path / "dup.jsonl", [*PASSAGES, Passage("doc-a", "Other", "text")])
    with pytest.raises(InputError, match=r"duplicate passage id \(rows 1 and 4\)") as err:
        Corpus.load(tmp_path / "dup.jsonl")
    assert err.value.record == "doc-a" and err.value.field == "id"

    lines = ['{"id": "a", "title": "A", "contents": "x"}', '{"id": "b", "title": "B"}']
    (tmp_path / "missing.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="missing") as err:
        Corpus.load(tmp_path / "missing.jsonl")
    assert (err.value.line, err.value.record, err.value.field) == (2, "b", "contents")

    lines = ['{"title": "A", "contents": "x"}', '{"id": "b", "title": "B", "contents": "y"}']
    (tmp_path / "mixed.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="id present") as err:
        Corpus.load(tmp_path / "mixed.jsonl")
    assert err.value.line == 2

    (tmp_path / "latin1.jsonl").write_bytes(
        b'{"title": "A", "contents": "x"}\n{"title": "caf\xe9", "contents": "y"}\n'
    )
    with pytest.raises(InputError, match="not UTF-8") as err:
        Corpus.load(tmp_path / "latin1.jsonl")
    assert err.value.line == 2

    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(InputError, match="no passages"):
        Corpus.load(tmp_path / "empty.jsonl")

    (tmp_path / "corpus.tsv").write_text("a\tb\n", encoding="utf-8")
    with pytest.raises(InputError, match="unknown corpus suffix"):
        Corpus.load(tmp_path / "corpus.tsv")
    # nothing half-written: no store and no temporary folder for any of the bad sources
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=6), min_size=1, max_size=40, unique=True))
def test_any_unique_string_ids_are_found_in_their_rows(ids):
    with tempfile.TemporaryDirectory() as tmp:
        write_corpus_jsonl(Path(tmp) / "c.jsonl", [Passage(i, f"t{n}", i) for n, i in enumerate(ids)])
        corpus = Corpus.load(Path(tmp) / "c.jsonl")
        assert [corpus.row(i) for i in ids] == list(range(len(ids)))
        assert [p.contents for p in corpus.get_many(ids)] == ids


OPEN_AND_REPORT = """
import os, sys
from corag.data.corpus import Corpus
corpus = Corpus.load(sys.argv[1])
print(os.stat(corpus.store / "store.json").st_ino, corpus.get(sys.argv[2]).contents)
"""


def test_processes_opening_one_source_at_once_convert_it_once(tmp_path):
    passages = [Passage(f"p{i}", f"T{i}", f"text {i} " * 20) for i in range(30_000)]
    write_corpus_jsonl(tmp_path / "c.jsonl", passages)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AND_REPORT, str(tmp_path / "c.jsonl"), "p29999"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TQDM_DISABLE": "1"},
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    inodes = {out.split()[0] for out, _ in outputs}
    assert len(inodes) == 1  # all three read the one store that one of them wrote
    assert all(out.split(maxsplit=1)[1].strip() == passages[-1].contents.strip() for out, _ in outputs)


def test_a_process_waits_while_another_holds_the_store_lock(tmp_path):
    from corag.data.corpus import default_store_path
    from corag.data.jsonl import locked

    write_corpus_jsonl(tmp_path / "c.jsonl", PASSAGES)
    with locked(default_store_path(tmp_path / "c.jsonl")):
        proc = subprocess.Popen(
            [sys.executable, "-c", OPEN_AND_REPORT, str(tmp_path / "c.jsonl"), "doc-a"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert "waiting for another process" in proc.stderr.readline()
        assert proc.poll() is None and not (tmp_path / "c.jsonl.corag").exists()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.split(maxsplit=1)[1].strip() == PASSAGES[1].contents


# wiki-18 as Search-R1 and FlashRAG publish it: {"id", "contents": "\"Title\"\ntext"}, no title field
WIKI18 = [
    {"id": "0", "contents": '"Kuto"\nKuto is a country whose capital is Rira.'},
    {"id": "1", "contents": '"Rira"\nRira is a city in Kuto.\nIt lies on a river.'},
    {"id": "2", "contents": "\nA passage without a title."},
]


def test_wiki18_layout_reads_its_first_line_as_the_title(tmp_path):
    from corag.prompts import search_r1_information
    from corag.retrieval.dense import passage_text

    write_jsonl(tmp_path / "wiki-18.jsonl", WIKI18)
    corpus = Corpus.load(tmp_path / "wiki-18.jsonl")
    assert list(corpus.ids) == ["0", "1", "2"]
    assert corpus.get("1") == Passage("1", '"Rira"', "Rira is a city in Kuto.\nIt lies on a river.")
    assert corpus.get("2") == Passage("2", "", "A passage without a title.")
    # embedded as the release embedded `contents`; shown as Search-R1 shows it (title line verbatim)
    assert [passage_text(p) for p in corpus.get_many(["0", "1"])] == [r["contents"] for r in WIKI18[:2]]
    assert search_r1_information(corpus.get_many(["0"])).startswith(
        '\n\n<information>Doc 1(Title: "Kuto") Kuto is a country'
    )


def test_corag_index_reads_the_wiki18_layout_as_it_is(tmp_path, capsys):
    from corag.cli import main
    from corag.retrieval import load_retriever

    write_jsonl(tmp_path / "wiki-18.jsonl", WIKI18)
    args = ["index", str(tmp_path / "wiki-18.jsonl"), "--out", str(tmp_path / "bm25"), "--kind", "bm25"]
    assert main(args) == 0
    hits = load_retriever(tmp_path / "bm25").search(["Which city lies on a river?"], k=1)[0]
    assert [h.doc_id for h in hits] == ["1"]


def test_wiki18_layout_and_titled_lines_do_not_mix(tmp_path):
    for lines, line, message in [
        ([WIKI18[0], {"id": "1", "title": "Rira", "contents": "x"}], 2, "title present"),
        ([{"id": "0", "title": "Rira", "contents": "x"}, WIKI18[1]], 2, "title missing"),
        ([WIKI18[0], {"id": "1", "contents": 3}], 2, "contents"),
    ]:
        write_jsonl(tmp_path / "bad.jsonl", lines)
        with pytest.raises(InputError, match=message) as err:
            Corpus.load(tmp_path / "bad.jsonl")
        assert err.value.line == line and err.value.record == "1"
        assert str(tmp_path / "bad.jsonl") in str(err.value)


def test_prepare_command_writes_a_store(tmp_path, capsys):
    from corag.cli import main

    write_corpus_jsonl(tmp_path / "c.jsonl", PASSAGES)
    assert main(["corpus", "prepare", str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "store")]) == 0
    assert "4 passages in" in capsys.readouterr().out
    assert Corpus.load(tmp_path / "store").get("doc-a") == PASSAGES[1]
    assert prepare_corpus(tmp_path / "c.jsonl", tmp_path / "store") == tmp_path / "store"


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


def test_from_contexts_command_round_trip_on_real_hotpotqa(shared_data: Path, tmp_path, capsys):
    from corag.cli import main

    raw_path = shared_data / "hotpotqa" / "hotpot_dev_distractor_sample.json"
    out = tmp_path / "ctx" / "corpus.jsonl"
    assert main(["corpus", "from-contexts", str(raw_path), "--out", str(out)]) == 0
    questions = tmp_path / "ctx" / "corpus.questions.jsonl"
    assert f"103 questions in {questions}" in capsys.readouterr().out
    raw = json.loads(raw_path.read_text(encoding="utf-8"))
    examples = load_examples(questions)  # the project's question JSONL
    assert [(e.id, e.query, e.answers[0], e.task) for e in examples] == [
        (r["_id"], r["question"].strip(), r["answer"], "hotpotqa") for r in raw
    ]
    corpus = Corpus.load(out)
    for example, record in zip(examples, raw, strict=True):
        gold_titles = {title for title, _ in record["supporting_facts"]}
        passages = corpus.get_many(example.supporting_ids)
        assert {p.title for p in passages} == gold_titles, example.id
        contexts = {(t, "".join(s).strip()) for t, s in record["context"] if t in gold_titles}
        assert {(p.title, p.contents) for p in passages} == contexts

    # scoring those questions reports passage recall: the gold ids found, or not
    lines = [
        {
            "query_id": e.id,
            "predictions": e.answers[0],
            "context_doc_ids": list(e.supporting_ids) if i % 2 else [],
        }
        for i, e in enumerate(examples)
    ]
    write_jsonl(tmp_path / "preds.jsonl", lines)
    args = ["evaluate", "--data", str(questions), "--predictions", str(tmp_path / "preds.jsonl")]
    assert main([*args, "--out-dir", str(tmp_path / "eval")]) == 0
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["recall@5_question"] == pytest.approx(100 * 51 / 103)
    assert metrics["em"] == 100.0 and metrics["settings"]["predictions"] == str(tmp_path / "preds.jsonl")
    assert metrics["wall_seconds"] >= 0


def test_from_contexts_refuses_one_title_with_two_texts_and_keeps_one_paragraph_given_twice(
    shared_data: Path, tmp_path, capsys
):
    """HotpotQA names a paragraph by its title: two files giving one title two texts are refused in one
    line naming both files, and nothing is written; the same paragraph in both files is one passage."""
    from corag.cli import main

    raw = json.loads(
        (shared_data / "hotpotqa" / "hotpot_dev_distractor_sample.json").read_text(encoding="utf-8")
    )
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(json.dumps(raw[:60]))
    second.write_text(json.dumps(raw[40:]))  # 20 questions, and their paragraphs, in both files
    out = tmp_path / "out" / "corpus.jsonl"
    assert main(["corpus", "from-contexts", str(first), str(second), "--out", str(out)]) == 0
    distinct = {(t, "".join(s).strip()) for r in raw for t, s in r["context"]}
    assert len(read_jsonl(out)) == len(distinct) == len({t for t, _ in distinct})
    capsys.readouterr()

    changed = json.loads(json.dumps(raw[40:]))
    title = changed[5]["context"][2][0]
    changed[5]["context"][2][1] = ["Another text under the same title."]
    second.write_text(json.dumps(changed))
    out = tmp_path / "clash" / "corpus.jsonl"
    assert main(["corpus", "from-contexts", str(first), str(second), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"paragraph {title!r} has another text here than in {first}" in err, err
    assert err.startswith(f"corag corpus: error: {second}, id '{changed[5]['_id']}', field 'context'"), err
    assert not out.parent.exists()
