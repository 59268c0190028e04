"""`corag predict` end to end on the toy world: records, appending, resuming, bad settings."""

from __future__ import annotations

import json

import pytest

from corag.commands.predict import main
from corag.errors import InputError

OFFICIAL = ("query", "answers", "query_id", "context_doc_ids", "subqueries", "subanswers", "predictions")


@pytest.fixture(scope="module")
def bm25_dir(toy_world, tmp_path_factory):
    from corag.retrieval.bm25 import build_bm25_folder

    folder = tmp_path_factory.mktemp("bm25") / "index"
    build_bm25_folder([toy_world.passages], folder)
    return folder


def args(short_model_dir, toy_dir, bm25_dir, out, *extra):
    return [
        "--model", str(short_model_dir), "--backend", "hf", "--device", "cpu",
        "--data", str(toy_dir / "test.jsonl"), "--corpus", str(toy_dir / "corpus.jsonl"),
        "--retriever", str(bm25_dir), "--out", str(out), "--limit", "4", *extra,
    ]  # fmt: skip


def read(out):
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_predict_writes_records_and_resumes_without_loss_or_duplicates(
    short_model_dir, toy_dir, bm25_dir, tmp_path
):
    out = tmp_path / "pred" / "predictions.jsonl"
    argv = args(short_model_dir, toy_dir, bm25_dir, out, "--strategy", "best_of_n", "--n", "2", "--max-steps", "1",
                "--budget", "20000")  # fmt: skip
    assert main(argv) == 0
    full = read(out)
    questions = [json.loads(line) for line in (toy_dir / "test.jsonl").read_text().splitlines()][:4]
    assert sorted(r["query_id"] for r in full) == sorted(q["id"] for q in questions)
    for record in full:
        assert all(key in record for key in OFFICIAL)
        assert record["strategy"] == "best_of_n" and len(record["penalties"]) == 2
        assert record["subqueries"] == [s["subquery"] for s in record["steps"]]
        assert all(len(s["doc_ids"]) <= 5 for s in record["steps"]) and len(record["context_doc_ids"]) <= 20
        assert 0 < record["usage"]["total_tokens"] <= 20000 and record["model_calls"] > 0
    # a crash after two questions, in the middle of writing the third line
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:2]) + lines[2][:25])
    assert main(argv) == 0
    resumed = read(out)
    assert [r["query_id"] for r in resumed[:2]] == [r["query_id"] for r in full[:2]]
    assert sorted(r["query_id"] for r in resumed) == sorted(r["query_id"] for r in full)
    by_id = {r["query_id"]: r for r in full}
    for r in resumed:  # penalties may differ in the last float bits with the batch's padding
        same = by_id[r["query_id"]]
        assert r["penalties"] == pytest.approx(same["penalties"], abs=1e-5)
        assert {**r, "penalties": None} == {
            **same,
            "penalties": None,
        }  # same predictions as the uninterrupted run
    assert main(argv) == 0 and read(out) == resumed  # nothing left to do
    assert main([*argv, "--official-files"]) == 0  # the official files, beside ours
    preds = read(out.parent / "preds_best_of_n_multihopqa_test.jsonl")
    assert {p["query_id"]: p["prediction"] for p in preds} == {
        r["query_id"]: r["predictions"] for r in resumed
    }
    official = json.loads((out.parent / "metrics_multihopqa_test_best_of_n.json").read_text())
    assert official["token_consumed"] == sum(r["usage"]["total_tokens"] for r in resumed)
    assert (official["num_samples"], official["max_path_length"], official["eval_split"]) == (4, 1, "test")


@pytest.mark.parametrize(
    "extra, field",
    [
        (["--strategy", "beam"], "strategy"),
        (["--max-steps", "-1"], "--max-steps"),
        (["--strategy", "best_of_n", "--n", "0"], "--n"),
        (["--budget", "0"], "--budget"),
        (["--task", "chess"], "--task"),
    ],
)
def test_bad_settings_fail_before_any_work(tmp_path, extra, field):
    out = tmp_path / "p.jsonl"
    argv = ["--model", "m", "--data", "d", "--corpus", "c", "--retriever", "i", "--out", str(out), *extra]
    with pytest.raises(InputError) as info:
        main(argv)
    assert info.value.field == field and not out.exists()


def test_duplicate_question_ids_are_an_error(short_model_dir, toy_dir, bm25_dir, tmp_path):
    data = tmp_path / "dup.jsonl"
    line = (toy_dir / "test.jsonl").read_text().splitlines()[0]
    data.write_text(line + "\n" + line + "\n")
    argv = args(short_model_dir, toy_dir, bm25_dir, tmp_path / "o.jsonl")
    argv[argv.index("--data") + 1] = str(data)
    with pytest.raises(InputError, match="duplicate"):
        main(argv)
