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
FLASHRAG = "flashrag/multihopqa_dev_sample.jsonl"


@pytest.fixture(scope="session")
def loaded(shared_data: Path) -> dict[str, list[Example]]:
    """Every real sample file, read through format auto-detection."""
    names = (HOTPOT, TWOWIKI, MUSIQUE, BAMBOOGLE, KILT, FLASHRAG)
    return {name: load_examples(shared_data / name) for name in names}


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
        FLASHRAG: "flashrag",
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
    assert len(examples) == 1000 and {e.task for e in examples} == {"kilt_hotpotqa"}
    ex = examples[0]
    assert (ex.id, ex.answers) == ("5a8b57f25542995d1e6f1371", ("yes",))
    # Wikipedia page ids are pages, not passages: they never become supporting_ids
    assert ex.supporting_pages == ("2816539", "10520") and ex.supporting_ids == ()
    assert ex.supporting_titles == ("Scott Derrickson", "Ed Wood")
    last = by_id(examples)["5ade664555429939a52fe89c"]
    assert last.answers == ("Miami Gardens, Florida,",) and last.supporting_pages == ("4322179", "362322")
    assert last.meta["provenance"][0]["section"]
    # a KILT file names tasks in KILT's namespace: its hotpotqa is KILT's HotpotQA
    assert load_examples(shared_data / KILT, task="hotpotqa")[0].task == "kilt_hotpotqa"
    assert load_examples(shared_data / KILT, task="nq")[0].task == "nq"


def test_flashrag(shared_data, loaded, tmp_path):
    examples = loaded[FLASHRAG]
    assert [e.id for e in examples] == [f"dev_{i}" for i in range(5)]
    assert {e.task for e in examples} == {"multihopqa"}  # from the file's name
    assert examples[0].query == "which river flows through the capital of austria"
    assert examples[0].answers == ("Danube", "Danube River") and examples[0].meta == {}
    assert examples[1].meta == {"metadata": {"type": "bridge", "level": "easy"}}
    assert load_examples(shared_data / FLASHRAG, task="nq")[0].task == "nq"

    record = {"id": "test_0", "question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}
    bad = [
        ({**record, "golden_answers": "Shakespeare"}, "golden_answers", "expected a list"),
        ({**record, "golden_answers": [3]}, "golden_answers", "expected a list of strings"),
        ({k: v for k, v in record.items() if k != "golden_answers"}, "golden_answers", "missing required"),
        ({**record, "question": 7}, "question", "expected a str"),
    ]
    for broken, field, message in bad:
        _write_lines(tmp_path / "nq_test.jsonl", [json.dumps(record), json.dumps(broken)])
        with pytest.raises(InputError, match=message) as err:
            load_examples(tmp_path / "nq_test.jsonl")
        assert (err.value.line, err.value.record, err.value.field) == (2, "test_0", field)
    _write_lines(tmp_path / "nq_test.jsonl", [json.dumps(record)] * 2)
    with pytest.raises(InputError, match="duplicate id"):
        load_examples(tmp_path / "nq_test.jsonl")
    _write_lines(tmp_path / "questions.jsonl", [json.dumps(record)])
    with pytest.raises(InputError, match="pass --task"):
        load_examples(tmp_path / "questions.jsonl")


# Search-R1's suite: FlashRAG_datasets/<dataset>/<split>.jsonl, the task told by the dataset folder
SUITE = {  # folder -> (split published, task, rule under --rules official)
    "nq": ("test", "nq", "kilt"),
    "triviaqa": ("test", "triviaqa", "kilt"),
    "popqa": ("test", "popqa", "squad"),
    "hotpotqa": ("dev", "hotpotqa", "hotpotqa"),
    "2wikimultihopqa": ("dev", "2wikimultihopqa", "2wikimultihopqa"),
    "musique": ("dev", "musique", "musique"),
    "bamboogle": ("test", "bamboogle", "squad"),
}


def _suite_file(root, folder: str, records: list[dict]) -> Path:
    path = root / "FlashRAG_datasets" / folder / f"{SUITE[folder][0]}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return _write_lines(path, [json.dumps(r) for r in records])


def test_search_r1_suite_loads_each_set_with_its_task_and_rule(tmp_path):
    from corag.evaluation import rule_of

    for folder, (split, task, rule) in SUITE.items():
        record = {"id": f"{split}_0", "question": f"a {folder} question", "golden_answers": ["Ada", "A. L."]}
        examples = load_examples(_suite_file(tmp_path, folder, [record, {**record, "id": f"{split}_1"}]))
        assert [e.task for e in examples] == [task, task], folder
        assert examples[0].answers == ("Ada", "A. L.") and examples[0].query == f"a {folder} question"
        assert (rule_of(examples[0]), rule_of(examples[0], "search-r1")) == (rule, "search-r1")
    # --task and a record's own task win over the folder; a folder that names no task asks for --task
    nq = tmp_path / "FlashRAG_datasets" / "nq" / "test.jsonl"
    assert load_examples(nq, task="popqa")[0].task == "popqa"
    record = {"id": "test_0", "question": "q", "golden_answers": ["a"]}
    for folder in ("nq/own", "wikiqa"):
        (tmp_path / folder).mkdir(parents=True)
    _write_lines(tmp_path / "nq" / "own" / "test.jsonl", [json.dumps({**record, "task": "bamboogle"})])
    assert load_examples(tmp_path / "nq" / "own" / "test.jsonl")[0].task == "bamboogle"
    _write_lines(tmp_path / "wikiqa" / "test.jsonl", [json.dumps(record)])
    with pytest.raises(InputError, match="pass --task"):
        load_examples(tmp_path / "wikiqa" / "test.jsonl")
    assert load_examples(_write_lines(tmp_path / "popqa_test.jsonl", [json.dumps(record)]))[0].task == "popqa"


def test_empty_gold_answers_are_kept_and_scored_as_search_r1_scores_them(tmp_path):
    """Search-R1's em_check (verl/utils/reward_score/qa_em.py) matches an empty prediction against an
    empty gold answer and keeps the record; KILT's rule takes no empty answer as gold (scores 0)."""
    from corag.evaluation import answer_row, rule_of

    records = [
        {"id": "test_0", "question": "who?", "golden_answers": ["Ada"]},
        {"id": "test_1", "question": "who?", "golden_answers": ["", " "]},
        {"id": "test_2", "question": "who?", "golden_answers": ["", "Ada"]},
    ]
    examples = load_examples(_suite_file(tmp_path, "nq", records))
    assert [e.answers for e in examples] == [("Ada",), ("",), ("", "Ada")]
    em = {(e.id, p): answer_row(p, e, "search-r1")["em"] for e in examples for p in ("", "the Ada.")}
    assert em == {
        ("test_0", ""): 0.0,
        ("test_0", "the Ada."): 1.0,
        ("test_1", ""): 1.0,
        ("test_1", "the Ada."): 0.0,
        ("test_2", ""): 1.0,
        ("test_2", "the Ada."): 1.0,
    }
    assert rule_of(examples[1]) == "kilt" and answer_row("", examples[1], "kilt")["em"] == 0.0


def test_search_r1_suite_bad_records_name_file_line_and_field(tmp_path):
    good = {"id": "test_0", "question": "who?", "golden_answers": ["Ada"]}
    bad = [
        ({"id": "test_1", "question": "who?", "golden_answers": [None]}, "golden_answers"),
        ({"id": "test_1", "question": "who?", "golden_answers": ["Ada"], "metadata": "x"}, "metadata"),
        ({"id": "test_1", "question": ["who?"], "golden_answers": ["Ada"]}, "question"),
        ({"id": "test_1", "question": "who?", "golden_answers": ["Ada"], "task": "squadqa"}, "task"),
    ]
    for folder in SUITE:
        for broken, field in bad:
            path = _suite_file(tmp_path, folder, [good, broken])
            with pytest.raises(InputError) as err:
                load_examples(path)
            assert (err.value.file, err.value.line, err.value.field) == (str(path), 2, field), folder
            assert str(path) in str(err.value) and "line 2" in str(err.value)


def test_kilt_provenance_only_outputs_and_test_files(tmp_path):
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
    assert (ex.id, ex.task, ex.answers, ex.supporting_pages) == ("3", "fever", ("SUPPORTS",), ("7570", "11"))

    write_jsonl(
        path,
        [
            {"id": "p", "input": "x", "output": [{"answer": "SUPPORTS"}]},
            {"id": "q", "input": "y", "output": [{"provenance": []}]},
        ],
    )
    with pytest.raises(InputError, match="no non-empty answer") as err:
        load_examples(path)
    assert (err.value.line, err.value.record, err.value.field) == (2, "q", "output")
    write_jsonl(tmp_path / "nq-test_without_answers-kilt.jsonl", [{"id": "q", "input": "who?"}])
    (test_q,) = load_examples(tmp_path / "nq-test_without_answers-kilt.jsonl")
    assert test_q.answers == () and test_q.task == "nq"
    with pytest.raises(InputError, match="no non-empty answer"):
        load_examples(tmp_path / "nq-test_without_answers-kilt.jsonl", require_answers=True)


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
        load_jsonl(path, task="multihopqa")
    e = err.value
    assert (e.file, e.line, e.field) == (str(path), 3, field)
    assert e.record in ("q1", "q2")
    assert str(path) in str(e) and "line 3" in str(e) and repr(field) in str(e)


def test_malformed_line_in_a_question_file(tmp_path):
    path = _write_lines(tmp_path / "questions.jsonl", [GOOD, '{"id": "q2", "query": "Who?"'])
    with pytest.raises(InputError, match="malformed JSON") as err:
        load_examples(path, fmt="jsonl", task="multihopqa")
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
    assert set(LOADERS) == {
        "jsonl",
        "hotpotqa",
        "2wiki",
        "musique",
        "bamboogle",
        "kilt",
        "multihopqa",
        "flashrag",
    }
    with pytest.raises(InputError, match="no records"):
        detect_format(_write_lines(tmp_path / "data.json", ["[]"]))
    with pytest.raises(InputError, match="pass --format"):
        detect_format(_write_lines(tmp_path / "data.json", ['[{"q": "x"}]']))
    with pytest.raises(InputError, match="unknown format"):
        load_examples(shared_data / HOTPOT, fmt="squad")
    with pytest.raises(InputError, match="no such file"):
        load_examples(tmp_path / "missing.jsonl")
    # fmt overrides the name: the KILT sample read as plain JSONL lacks the plain fields
    with pytest.raises(InputError, match="missing required field") as err:
        load_examples(shared_data / KILT, fmt="jsonl")
    assert (err.value.line, err.value.field) == (1, "query")


# Real variants of the published files, each told by its keys ----------------------------------------


def _as_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def test_hotpotqa_and_2wiki_as_json_lines_load_as_the_arrays_do(shared_data, loaded, tmp_path):
    for name, fmt in ((HOTPOT, "hotpotqa"), (TWOWIKI, "2wiki")):
        records = json.loads((shared_data / name).read_text(encoding="utf-8"))
        copy = _as_jsonl(tmp_path / f"{fmt}_copy.jsonl", records)
        assert detect_format(copy) == fmt
        assert load_examples(copy) == loaded[name]


def test_musique_as_a_json_array_and_without_paragraphs(shared_data, loaded, tmp_path):
    records = [json.loads(line) for line in (shared_data / MUSIQUE).read_text(encoding="utf-8").splitlines()]
    array = tmp_path / "musique_dev.json"
    array.write_text(json.dumps(records), encoding="utf-8")
    assert detect_format(array) == "musique" and load_examples(array) == loaded[MUSIQUE]
    questions_only = _as_jsonl(
        tmp_path / "open_domain.jsonl",
        [{k: r[k] for k in ("id", "question", "answer", "answer_aliases", "answerable")} for r in records],
    )
    examples = load_examples(questions_only)
    assert [(e.id, e.query, e.answers, e.task) for e in examples] == [
        (e.id, e.query, e.answers, "musique") for e in loaded[MUSIQUE]
    ]
    assert all("paragraphs" not in e.meta and e.supporting_titles == () for e in examples)


def test_the_format_comes_from_the_keys_not_the_name(shared_data, tmp_path):
    misleading = tmp_path / "musique_hotpot_kilt.json"  # every name in it is wrong
    misleading.write_bytes((shared_data / TWOWIKI).read_bytes())
    assert detect_format(misleading) == "2wiki"
    kilt_copy = tmp_path / "hotpot_dev_distractor.jsonl"
    kilt_copy.write_bytes((shared_data / KILT).read_bytes())
    assert detect_format(kilt_copy) == "kilt"
    # read as KILT by its keys; its name still says the task (HotpotQA, in KILT's namespace)
    assert {e.task for e in load_examples(kilt_copy)} == {"kilt_hotpotqa"}


def test_the_content_decides_where_the_suffix_misleads(shared_data, loaded, tmp_path):
    """JSON named .csv is read as JSON, not as Bamboogle; a .parquet whose bytes are not parquet is
    refused in one line; parquet bytes under another name are read as parquet."""
    json_csv = tmp_path / "bamboogle.csv"
    json_csv.write_bytes((shared_data / HOTPOT).read_bytes())
    assert detect_format(json_csv) == "hotpotqa"
    assert [e.query for e in load_examples(json_csv)] == [e.query for e in loaded[HOTPOT]]
    fake = tmp_path / "q.parquet"
    fake.write_text("id,question\n")
    with pytest.raises(InputError, match="not a parquet file") as err:
        load_examples(fake)
    assert err.value.file == str(fake)
    table = pa.Table.from_pylist([{"id": "a", "query": "who?", "answers": ["x"], "task": "nq"}])
    hidden = tmp_path / "q.data"
    pq.write_table(table, hidden)
    assert [e.id for e in load_examples(hidden)] == ["a"]


def test_2wiki_with_only_its_core_keys_is_2wiki_with_spaced_sentences(shared_data, loaded, tmp_path):
    """Without `evidences`, `entity_ids` and the other 2Wiki-only keys a 2Wiki file has HotpotQA's keys;
    its sentences, which carry no leading space as HotpotQA's do, tell it apart."""
    core = [
        {k: r[k] for k in ("_id", "question", "context", "supporting_facts", "answer")}
        for r in json.loads((shared_data / TWOWIKI).read_text())
    ]
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(core))
    assert detect_format(path) == "2wiki"
    got, want = load_examples(path), loaded[TWOWIKI]
    assert [e.task for e in got] == [e.task for e in want]
    assert [p["text"] for p in got[0].meta["paragraphs"]] == [p["text"] for p in want[0].meta["paragraphs"]]
    assert ". " in got[0].meta["paragraphs"][0]["text"]


def test_a_byte_order_mark_is_read_past_in_every_jsonl(shared_data, loaded, tmp_path):
    bom = tmp_path / "kilt_hotpotqa-dev.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + (shared_data / KILT).read_bytes())
    assert [e.id for e in load_examples(bom)] == [e.id for e in loaded[KILT]]


def test_2wiki_aliases_with_demonyms_and_an_empty_alias(shared_data, tmp_path):
    """The official script's gold set: {answer} | aliases | demonyms, an empty alias kept."""
    records = json.loads((shared_data / TWOWIKI).read_text(encoding="utf-8"))
    montreal = next(r for r in records if r["answer"] == "Montreal, Quebec")
    aliases = _as_jsonl(
        tmp_path / "id_aliases.json",
        [{"Q_id": montreal["answer_id"], "aliases": ["Montréal", ""], "demonyms": ["Montrealer"]}],
    )
    (ex,) = [e for e in load_examples(shared_data / TWOWIKI, aliases=aliases) if e.id == montreal["_id"]]
    assert ex.answers == ("Montreal, Quebec", "Montréal", "", "Montrealer")


# Bad input: one clear error naming the file, the line (or byte offset) and the field -----------------


def test_non_utf8_bytes_are_named_by_line_or_byte_offset(shared_data, tmp_path):
    lines = (shared_data / KILT).read_bytes().splitlines(keepends=True)[:3]
    bad = tmp_path / "hotpotqa-dev-kilt.jsonl"
    bad.write_bytes(lines[0] + lines[1].replace(b'"input": "', b'"input": "\xf6', 1) + lines[2])
    with pytest.raises(InputError, match=r"not UTF-8 text \(byte 0xf6 at column \d+\)") as err:
        load_examples(bad)
    assert (err.value.file, err.value.line) == (str(bad), 2)

    hotpot = json.loads((shared_data / HOTPOT).read_text(encoding="utf-8"))[:2]
    one_line = json.dumps(hotpot, ensure_ascii=False).encode()
    at = one_line.index(b"Derrickson")
    (tmp_path / "h.json").write_bytes(one_line[:at] + b"\xff" + one_line[at + 1 :])
    with pytest.raises(InputError, match=f"byte 0xff at byte offset {at}"):
        load_examples(tmp_path / "h.json")
    pretty = json.dumps(hotpot, indent=1, ensure_ascii=False).encode()
    line = pretty[: pretty.index(b"Derrickson")].count(b"\n") + 1
    (tmp_path / "h.json").write_bytes(pretty.replace(b"Derrickson", b"D\xffrrickson", 1))
    with pytest.raises(InputError, match=f"on line {line}") as err:
        load_examples(tmp_path / "h.json")
    assert err.value.line == line
    bamboogle = (shared_data / BAMBOOGLE).read_bytes().replace(b"james madison", b"james m\xe4dison")
    (tmp_path / "b.csv").write_bytes(bamboogle)
    with pytest.raises(InputError, match="not UTF-8 text .* on line 1"):
        load_examples(tmp_path / "b.csv")


def test_empty_files_folders_and_files_without_questions(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(InputError, match="empty file: no records"):
        load_examples(tmp_path / "empty.jsonl")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    with pytest.raises(InputError, match="no records in the file"):
        load_examples(tmp_path / "blank.jsonl")
    with pytest.raises(InputError, match="no questions in the file"):
        load_examples(tmp_path / "blank.jsonl", fmt="kilt", task="nq")
    (tmp_path / "none.json").write_text("[]")
    with pytest.raises(InputError, match="no questions in the file"):
        load_examples(tmp_path / "none.json", fmt="hotpotqa")
    with pytest.raises(InputError, match="is a folder, not a file") as err:
        load_examples(tmp_path)
    assert err.value.file == str(tmp_path)
    row = {"id": "b", "question": "q?", "answer": "B", "answer_aliases": [], "answerable": False}
    _as_jsonl(tmp_path / "full.jsonl", [row])
    with pytest.raises(InputError, match="no questions in the file"):
        load_examples(tmp_path / "full.jsonl")  # every record unanswerable, so skipped


def test_truncated_files_are_errors_not_shorter_records(shared_data, tmp_path):
    kilt = (shared_data / KILT).read_text(encoding="utf-8").splitlines(keepends=True)[:3]
    cut = tmp_path / "hotpotqa-dev-kilt.jsonl"
    cut.write_text("".join(kilt[:2]) + kilt[2][:200], encoding="utf-8")
    with pytest.raises(InputError, match="no newline: the file looks cut short") as err:
        load_examples(cut)
    assert err.value.line == 3

    one_line = json.dumps(json.loads((shared_data / HOTPOT).read_text(encoding="utf-8"))[:2])
    (tmp_path / "h.json").write_text(one_line[:-300])
    with pytest.raises(
        InputError, match=r"at byte offset \d+\); the array is never closed: the file looks cut short"
    ):
        load_examples(tmp_path / "h.json", fmt="hotpotqa")

    text = (shared_data / BAMBOOGLE).read_text(encoding="utf-8")
    inside_answer = text.index("Titan IIIE") + len("Titan I")
    (tmp_path / "b.csv").write_text(
        text[:inside_answer], encoding="utf-8"
    )  # the second row, cut in its answer
    with pytest.raises(InputError, match="5 columns where the first row has 7") as err:
        load_examples(tmp_path / "b.csv")
    assert (err.value.record, err.value.field) == ("bamboogle-1", "column 4")
    inside_quotes = text.index('"April 30') + 5
    (tmp_path / "b.csv").write_text(text[:inside_quotes], encoding="utf-8")
    with pytest.raises(InputError, match="malformed CSV .* cut short"):
        load_examples(tmp_path / "b.csv")
    after_answer = text.index("Titan IIIE") + len("Titan IIIE,")
    (tmp_path / "b.csv").write_text(text[:after_answer], encoding="utf-8")  # a whole answer, columns missing
    with pytest.raises(
        InputError, match="6 columns where the first row has 7: the file looks cut short"
    ) as err:
        load_examples(tmp_path / "b.csv")
    assert (err.value.record, err.value.line) == ("bamboogle-1", 2)


def test_tasks_come_from_the_command_the_records_or_the_name(tmp_path):
    rows = [{"query": "Who?", "answers": ["Ann"], "query_id": "a", "context_doc_ids": ["3"]}]
    write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(InputError, match="pass --task") as err:
        load_examples(tmp_path / "rows.jsonl")
    assert (err.value.line, err.value.record, err.value.field) == (1, "a", "task")
    assert load_examples(tmp_path / "rows.jsonl", task="triviaqa")[0].task == "triviaqa"
    write_jsonl(tmp_path / "rows.jsonl", [{**rows[0], "task": "fever", "task_desc": "check the claim"}])
    (ex,) = load_examples(tmp_path / "rows.jsonl")
    assert ex.task == "fever" and ex.meta["task_desc"] == "check the claim"
    assert load_examples(tmp_path / "rows.jsonl", task="nq")[0].task == "nq"  # --task wins
    with pytest.raises(InputError, match="unknown task 'squad'") as err:
        load_examples(tmp_path / "rows.jsonl", task="squad")
    assert err.value.field == "--task"
    write_jsonl(tmp_path / "rows.jsonl", [{**rows[0], "task": "quiz"}])
    with pytest.raises(InputError, match="unknown task 'quiz'") as err:
        load_examples(tmp_path / "rows.jsonl")
    assert (err.value.line, err.value.record) == (1, "a")


def test_a_hub_split_gets_its_task_from_its_folders_or_the_data(tmp_path):
    """corag/kilt's parquet splits are all called validation-00000-of-00001.parquet."""
    rows = [
        {
            "query": "who sings love story?",
            "answers": ["Taylor Swift"],
            "query_id": "n1",
            "context_doc_ids": [7],
        },
        {"query": "who wrote dune?", "answers": ["Frank Herbert"], "query_id": "n2", "context_doc_ids": [9]},
    ]
    hub = tmp_path / "datasets--corag--kilt" / "snapshots" / "abc123"
    for config in ("nq", "hotpotqa", "fever"):
        (hub / config).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), hub / config / "validation-00000-of-00001.parquet")
    assert load_examples(hub / "nq" / "validation-00000-of-00001.parquet")[0].task == "nq"
    assert load_examples(hub / "hotpotqa" / "validation-00000-of-00001.parquet")[0].task == "kilt_hotpotqa"
    lone = tmp_path / "validation-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows), lone)
    with pytest.raises(InputError, match="pass --task"):
        load_examples(lone)
    assert {e.task for e in load_examples(lone, task="fever")} == {"fever"}
    pq.write_table(pa.Table.from_pylist([{**r, "task": "triviaqa"} for r in rows]), lone)
    assert {e.task for e in load_examples(lone)} == {"triviaqa"}
    test_split = tmp_path / "nq" / "test-00000-of-00001.parquet"
    test_split.parent.mkdir()
    pq.write_table(pa.Table.from_pylist([{**r, "answers": []} for r in rows]), test_split)
    assert [e.answers for e in load_examples(test_split, task="nq")] == [(), ()]
