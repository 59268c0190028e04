"""The benchmark loaders read the real sample files of every format, and refuse bad input clearly."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corag.data.formats import (
    LOADERS,
    detect_format,
    example_to_record,
    kilt_task_from_name,
    load_examples,
    load_jsonl,
)
from corag.data.jsonl import write_jsonl
from corag.errors import InputError
from corag.types import Example, Step

HOTPOT = "hotpotqa/hotpot_dev_distractor_sample.json"
TWOWIKI = "2wikimultihopqa/2wiki_dev_sample.json"
MUSIQUE = "musique/musique_ans_v1.0_dev_sample.jsonl"
BAMBOOGLE = "bamboogle/bamboogle.csv"
KILT = "kilt/hotpotqa-dev-kilt.sample.jsonl"


@pytest.fixture(scope="session")
def loaded(shared_data: Path) -> dict[str, list[Example]]:
    """Every real sample file, read through format auto-detection."""
    return {name: load_examples(shared_data / name) for name in (HOTPOT, TWOWIKI, MUSIQUE, BAMBOOGLE, KILT)}


def by_id(examples: list[Example]) -> dict[str, Example]:
    return {e.id: e for e in examples}


def test_every_sample_file_is_detected_and_loaded(shared_data, loaded):
    files = sorted(
        p.relative_to(shared_data).as_posix() for p in shared_data.glob("*/*") if p.suffix != ".md"
    )
    assert files == sorted(loaded)  # a new sample file would need a loader test here
    expected = {
        HOTPOT: "hotpotqa",
        TWOWIKI: "2wiki",
        MUSIQUE: "musique",
        BAMBOOGLE: "bamboogle",
        KILT: "kilt",
    }
    assert {f: detect_format(shared_data / f) for f in files} == expected
    for name, examples in loaded.items():
        assert len({e.id for e in examples}) == len(examples), name
        assert all(
            e.query and e.answers and all(a.strip() == a and a for a in e.answers) for e in examples
        ), name


def test_hotpotqa(shared_data, loaded):
    raw = json.loads((shared_data / HOTPOT).read_text(encoding="utf-8"))
    examples = loaded[HOTPOT]
    assert len(examples) == len(raw) == 103
    ex = by_id(examples)["5a8b57f25542995d1e6f1371"]
    assert ex.query == "Were Scott Derrickson and Ed Wood of the same nationality?"
    assert ex.answers == ("yes",) and ex.task == "hotpotqa"
    assert ex.supporting_titles == ("Scott Derrickson", "Ed Wood")
    assert (ex.meta["type"], ex.meta["level"]) == ("comparison", "hard")
    paragraphs = ex.meta["paragraphs"]
    assert len(paragraphs) == 10
    derrickson = next(p for p in paragraphs if p["title"] == "Scott Derrickson")
    assert derrickson["is_supporting"] and derrickson["text"].startswith(
        "Scott Derrickson (born July 16, 1966)"
    )
    assert "producer. He lives in Los Angeles" in derrickson["text"]  # sentences joined with their own spaces
    assert sum(p["is_supporting"] for p in paragraphs) == 2
    short = by_id(examples)["5abd259d55429924427fcf1a"]  # a record with only two paragraphs
    assert [p["title"] for p in short.meta["paragraphs"]] == ["Dictyosperma", "Huernia"]
    assert by_id(examples)["5ae738f75542991bbc9761c4"].answers == ("2003",)


def test_2wiki_with_and_without_aliases(shared_data, loaded, tmp_path):
    examples = loaded[TWOWIKI]
    assert len(examples) == 100
    ex = by_id(examples)["b088d3ca08e211ebbda4ac1f6bf848b6"]
    assert ex.query == "Which film whose director is younger, Forbidden Ground or Free Guy?"
    assert ex.answers == ("Free Guy",) and ex.task == "2wikimultihopqa"
    assert ex.supporting_titles == ("Forbidden Ground", "Free Guy", "Pál Gábor", "Shawn Levy")
    assert ex.meta["evidences"][0] == ["Forbidden Ground", "director", "Pál Gábor"]
    assert ex.meta["answer_id"] == "Q38685497" and ex.meta["type"] == "bridge_comparison"
    copping = next(p for p in ex.meta["paragraphs"] if p["title"] == "Martin Copping")
    assert "Mozzie in. Also known for his roles" in copping["text"]  # 2Wiki sentences joined with a space

    # the published id_aliases.json is JSONL with Q_id / aliases
    alias_file = tmp_path / "id_aliases.json"
    alias_file.write_text(
        json.dumps({"Q_id": "Q38685497", "aliases": ["Free Guy (film)", "Free Guy"], "demonyms": []})
        + "\n"
        + json.dumps({"Q_id": "Q18393563", "aliases": ["Rathi Manmadhan"], "demonyms": []})
        + "\n",
        encoding="utf-8",
    )
    with_aliases = by_id(load_examples(shared_data / TWOWIKI, aliases=alias_file))
    assert with_aliases["b088d3ca08e211ebbda4ac1f6bf848b6"].answers == ("Free Guy", "Free Guy (film)")
    assert with_aliases["c1353b5f085711ebbd5aac1f6bf848b6"].answers == ("Rathimanmadhan", "Rathi Manmadhan")
    as_mapping = by_id(load_examples(shared_data / TWOWIKI, fmt="2wiki", aliases={"Q18393563": ("Rathi",)}))
    assert as_mapping["c1353b5f085711ebbd5aac1f6bf848b6"].answers == ("Rathimanmadhan", "Rathi")


def test_musique(shared_data, loaded):
    raw = [json.loads(line) for line in (shared_data / MUSIQUE).read_text(encoding="utf-8").splitlines()]
    examples = loaded[MUSIQUE]
    assert len(examples) == sum(r["answerable"] for r in raw) == 120
    ex = by_id(examples)["2hop__574419_270105"]
    assert ex.query == "What is the seat of the county where Van Hook Township is located?"
    assert ex.answers == ("Stanley",) and ex.task == "musique"
    assert ex.decomposition == (
        Step("Van Hook Township >> located in the administrative territorial entity", "Mountrail County"),
        Step("Mountrail County >> capital", "Stanley"),  # "#1" filled with the first answer
    )
    # supporting titles follow the hops (paragraph 8 for hop 1, paragraph 1 for hop 2)
    assert ex.supporting_titles == (
        "Van Hook Township, Mountrail County, North Dakota",
        "Mountrail County Courthouse",
    )
    assert [d["paragraph_support_idx"] for d in ex.meta["question_decomposition"]] == [8, 1]
    assert len(ex.meta["paragraphs"]) == 20
    benson = by_id(examples)["2hop__335418_279684"]
    assert benson.answers == (
        "Pittsburgh Pirates",
        "Orioles",
        "Pirates",
        "Baltimore Orioles",
        "New York Mets",
        "Mets",
    )
    assert benson.decomposition[1].subquery == "Kris Benson >> member of sports team"
    assert by_id(examples)["2hop__51261_87295"].answers[0] == "Queen dowager Clarisse Renaldi"


def test_musique_full_skips_unanswerable_records(tmp_path):
    base = {"paragraphs": [{"idx": 0, "title": "T", "paragraph_text": "x", "is_supporting": True}]}
    rows = [
        {**base, "id": "a", "question": "q?", "answer": "A", "answer_aliases": [], "answerable": True},
        {**base, "id": "b", "question": "q?", "answer": "B", "answer_aliases": [], "answerable": False},
    ]
    write_jsonl(tmp_path / "musique_full_v1.0_dev.jsonl", rows)
    assert [e.id for e in load_examples(tmp_path / "musique_full_v1.0_dev.jsonl")] == ["a"]
    assert len(load_examples(tmp_path / "musique_full_v1.0_dev.jsonl", answerable_only=False)) == 2


def test_bamboogle(shared_data, loaded):
    with (shared_data / BAMBOOGLE).open(encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    examples = loaded[BAMBOOGLE]
    assert len(examples) == len(rows) == 125  # the embedded CRLF does not split a record
    assert (
        examples[0].query == "Who was president of the United States in the year that Citibank was founded?"
    )
    assert examples[0].answers == ("james madison",)
    two = [e for e in examples if len(e.answers) == 2]
    assert [(e.query, e.answers) for e in two] == [
        ("Who is the mother of the father of George Washington?", ("Mildred Warner", "Mildred Gale"))
    ]
    predecessor = next(e for e in examples if "longest-reigning British monarch" in e.query)
    assert predecessor.answers == ("George VI",)
    assert examples[-1].answers == ("One World, One Dream",) and examples[-1].task == "bamboogle"


def test_kilt(shared_data, loaded):
    examples = loaded[KILT]
    assert len(examples) == 1000 and {e.task for e in examples} == {"hotpotqa"}
    ex = examples[0]
    assert (ex.id, ex.answers) == ("5a8b57f25542995d1e6f1371", ("yes",))
    assert ex.supporting_ids == ("2816539", "10520") and ex.supporting_titles == (
        "Scott Derrickson",
        "Ed Wood",
    )
    last = by_id(examples)["5ade664555429939a52fe89c"]
    assert last.answers == ("Miami Gardens, Florida,",) and last.supporting_ids == ("4322179", "362322")
    assert last.meta["provenance"][0]["section"]
    assert load_examples(shared_data / KILT, task="multihop")[0].task == "multihop"


def test_kilt_tasks_from_names_and_provenance_only_outputs(tmp_path):
    assert kilt_task_from_name("structured_zeroshot-dev-kilt.jsonl") == "structured_zeroshot"
    assert kilt_task_from_name("/x/triviaqa-dev_id-kilt.jsonl") == "triviaqa"
    assert kilt_task_from_name("nq-test_without_answers-kilt.jsonl") == "nq"
    with pytest.raises(InputError, match="task="):
        kilt_task_from_name("my_questions.jsonl")
    path = tmp_path / "fever-dev-kilt.jsonl"
    write_jsonl(
        path,
        [
            {
                "id": 3,
                "input": "Nikolaj Coster-Waldau worked with the Fox Broadcasting Company.",
                "output": [
                    {"answer": "SUPPORTS"},
                    {"provenance": [{"wikipedia_id": "7570", "title": "Nikolaj Coster-Waldau"}]},
                    {"answer": "SUPPORTS", "provenance": [{"wikipedia_id": 11, "title": "Fox"}]},
                ],
            }
        ],
    )
    (ex,) = load_examples(path)
    assert (ex.id, ex.task, ex.answers, ex.supporting_ids) == ("3", "fever", ("SUPPORTS",), ("7570", "11"))

    write_jsonl(path, [{"id": "q", "input": "x", "output": [{"provenance": []}]}])
    with pytest.raises(InputError, match="no non-empty answer") as err:
        load_examples(path)
    assert (err.value.line, err.value.record, err.value.field) == (1, "q", "output")
    write_jsonl(tmp_path / "nq-test_without_answers-kilt.jsonl", [{"id": "q", "input": "who?"}])
    (test_q,) = load_examples(tmp_path / "nq-test_without_answers-kilt.jsonl", require_answers=False)
    assert test_q.answers == () and test_q.task == "nq"


MULTIHOPQA_ROWS = [
    {
        "query": "Who directed the film that won?",
        "answers": ["Ann Lee", "A. Lee"],
        "query_id": "h-1",
        "context_doc_ids": ["17", "4"],
        "subqueries": ["Which film won?", "Who directed Gold?"],
        "subanswers": ["Gold", "Ann Lee"],
        "predictions": "Ann Lee",
    },
    {
        "query": "Where is Kuto?",
        "answers": ["Rira"],
        "query_id": "h-2",
        "context_doc_ids": [],
        "subqueries": [],
        "subanswers": [],
        "predictions": "",
    },
]


def test_multihopqa_from_jsonl_parquet_and_dataset_agree(tmp_path):
    import datasets

    write_jsonl(tmp_path / "hotpotqa_train.jsonl", MULTIHOPQA_ROWS)
    pq.write_table(pa.Table.from_pylist(MULTIHOPQA_ROWS), tmp_path / "hotpotqa_train.parquet")
    from_jsonl = load_examples(tmp_path / "hotpotqa_train.jsonl")
    from_parquet = load_examples(tmp_path / "hotpotqa_train.parquet")
    from_dataset = load_examples(datasets.Dataset.from_list(MULTIHOPQA_ROWS), task="hotpotqa")
    assert from_jsonl == from_parquet == from_dataset
    ex = from_jsonl[0]
    assert (ex.id, ex.task, ex.answers) == ("h-1", "hotpotqa", ("Ann Lee", "A. Lee"))
    assert ex.decomposition == (Step("Which film won?", "Gold"), Step("Who directed Gold?", "Ann Lee"))
    assert ex.meta == {"context_doc_ids": ["17", "4"], "predictions": "Ann Lee"}

    bad = [{**MULTIHOPQA_ROWS[0], "subanswers": ["Gold"]}]
    write_jsonl(tmp_path / "bad.jsonl", bad)
    with pytest.raises(InputError, match="2 subqueries but 1 subanswers") as err:
        load_examples(tmp_path / "bad.jsonl", fmt="multihopqa")
    assert (err.value.line, err.value.record, err.value.field) == (1, "h-1", "subanswers")


def test_plain_jsonl_round_trip(tmp_path, loaded):
    originals = loaded[MUSIQUE][:5] + loaded[KILT][:5] + loaded[BAMBOOGLE][:5]
    write_jsonl(tmp_path / "questions.jsonl", (example_to_record(e) for e in originals))
    assert detect_format(tmp_path / "questions.jsonl") == "jsonl"
    assert load_examples(tmp_path / "questions.jsonl") == originals


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = '{"id": "q1", "query": "Who?", "answers": ["Ann"]}'


@pytest.mark.parametrize(
    ("line", "message", "field"),
    [
        ('{"id": "q2", "answers": ["Ann"]}', "missing required field", "query"),
        ('{"id": "q2", "query": "Who?", "answers": "Ann"}', "expected a list, got str", "answers"),
        ('{"id": "q2", "query": "Who?", "answers": []}', "at least one non-empty", "answers"),
        ('{"id": "q2", "query": "Who?", "answers": [""]}', "at least one non-empty", "answers"),
        ('{"id": "q2", "query": 7, "answers": ["Ann"]}', "expected a string, got int", "query"),
        ('{"id": "q1", "query": "Who?", "answers": ["Ann"]}', "duplicate id", "id"),
        (
            '{"id": "q2", "query": "Who?", "answers": ["A"], "decomposition": [{"subquery": "x"}]}',
            "missing required field",
            "subanswer",
        ),
    ],
)
def test_plain_jsonl_bad_records_name_file_line_id_and_field(tmp_path, line, message, field):
    path = _write_lines(tmp_path / "questions.jsonl", [GOOD, "", line])
    with pytest.raises(InputError, match=message) as err:
        load_jsonl(path)
    e = err.value
    assert (e.file, e.line, e.field) == (str(path), 3, field)
    assert e.record in ("q1", "q2")
    assert str(path) in str(e) and "line 3" in str(e) and repr(field) in str(e)


def test_malformed_line_in_a_question_file(tmp_path):
    path = _write_lines(tmp_path / "questions.jsonl", [GOOD, '{"id": "q2", "query": "Who?"'])
    with pytest.raises(InputError, match="malformed JSON") as err:
        load_examples(path, fmt="jsonl")
    assert err.value.line == 2 and err.value.file == str(path)


def test_bad_records_in_real_formats(tmp_path, shared_data):
    hotpot = json.loads((shared_data / HOTPOT).read_text(encoding="utf-8"))[:3]
    hotpot[1]["answer"] = " "
    (tmp_path / "hotpot_dev.json").write_text(json.dumps(hotpot), encoding="utf-8")
    with pytest.raises(InputError, match="empty answer") as err:
        load_examples(tmp_path / "hotpot_dev.json")
    assert (err.value.record, err.value.field) == (hotpot[1]["_id"], "answer")

    hotpot[1]["answer"], hotpot[2]["_id"] = "x", hotpot[0]["_id"]
    (tmp_path / "hotpot_dev.json").write_text(json.dumps(hotpot), encoding="utf-8")
    with pytest.raises(InputError, match="duplicate id") as err:
        load_examples(tmp_path / "hotpot_dev.json")
    assert err.value.record == hotpot[0]["_id"]

    lines = (shared_data / MUSIQUE).read_text(encoding="utf-8").splitlines()[:3]
    record = json.loads(lines[1])
    del record["paragraphs"][4]["paragraph_text"]
    lines[1] = json.dumps(record)
    _write_lines(tmp_path / "musique_dev.jsonl", lines)
    with pytest.raises(InputError, match="missing required field") as err:
        load_examples(tmp_path / "musique_dev.jsonl")
    assert (err.value.line, err.value.record, err.value.field) == (2, record["id"], "paragraph_text")

    (tmp_path / "b.csv").write_text('"Who?",,,,\r\n"Why?",,,\r\n', encoding="utf-8")
    with pytest.raises(InputError) as err:
        load_examples(tmp_path / "b.csv")
    assert err.value.record == "bamboogle-0" and err.value.field == "column 4"


def test_format_choice(tmp_path, shared_data):
    assert set(LOADERS) == {"jsonl", "hotpotqa", "2wiki", "musique", "bamboogle", "kilt", "multihopqa"}
    with pytest.raises(InputError, match="pass fmt"):
        detect_format(_write_lines(tmp_path / "data.json", ["[]"]))
    with pytest.raises(InputError, match="unknown format"):
        load_examples(shared_data / HOTPOT, fmt="squad")
    with pytest.raises(InputError, match="no such file"):
        load_examples(tmp_path / "missing.jsonl")
    # fmt overrides the name: the KILT sample read as plain JSONL lacks the plain fields
    with pytest.raises(InputError, match="missing required field") as err:
        load_examples(shared_data / KILT, fmt="jsonl")
    assert (err.value.line, err.value.field) == (1, "query")
