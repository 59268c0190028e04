"""The evaluation stage: run specs, prediction files, scores, resume, tables and KILT submissions."""

from __future__ import annotations

import json

import pytest

from corag.data.corpus import Corpus
from corag.data.formats import load_examples
from corag.errors import InputError
from corag.evaluation import (
    Run,
    parse_runs,
    read_predictions,
    run_method,
    score_records,
    write_kilt_submission,
    write_results,
)
from corag.kilt import validate_submission
from corag.lm import load_lm
from corag.retrieval.bm25 import BM25Retriever
from corag.types import Example


def test_run_specs_expand_grids_and_reject_unknown_methods():
    runs = parse_runs(["greedy:L=1,2", "best_of_n:L=3:N=2,4", "ircot"])
    assert [r.name for r in runs] == [
        "greedy:L=1",
        "greedy:L=2",
        "best_of_n:L=3:N=2",
        "best_of_n:L=3:N=4",
        "ircot",
    ]
    assert runs[3].kwargs == {"max_steps": 3, "n": 4}
    with pytest.raises(InputError, match="unknown method"):
        parse_runs(["beam:L=2"])
    with pytest.raises(InputError, match="key=value"):
        parse_runs(["greedy:L"])


EXAMPLES = [
    Example("q1", "Who?", ("Mina Ostrel",), supporting_ids=("d1", "d2"), meta={"hops": 2}),
    Example("q2", "Where?", ("Kuto", "Kuto City"), supporting_ids=("d3",), meta={"hops": 3}),
]


def _record(qid: str, prediction: str, context: list[str], steps: list[list[str]], tokens: int) -> dict:
    return {
        "query_id": qid,
        "predictions": prediction,
        "context_doc_ids": context,
        "steps": [{"subquery": "s", "subanswer": "a", "doc_ids": d} for d in steps],
        "usage": {"total_tokens": tokens},
        "model_calls": 3,
    }


def test_scores_recall_and_hops_on_a_hand_built_case():
    records = [
        _record("q1", "the Mina Ostrel.", ["d9", "d1", "d8"], [["d2", "d7"]], 100),
        _record("q2", "Kuto City", ["d5", "d6"], [["d3"]], 300),
    ]
    summary = score_records(EXAMPLES, records, "squad")
    assert summary["em"] == 100.0 and summary["tokens_per_question"] == 200.0
    assert summary["em_by_hops"] == {"2": 100.0, "3": 100.0}
    # Question alone: q1 finds d1 (1 of 2 gold) in its top 5, q2 finds nothing -> 25%.
    assert summary["recall@5_question"] == pytest.approx(25.0)
    # RRF of [d9, d1, d8] and [d2, d7]: d9, d2 (rank 1 twice), d1, d7, d8 -> both gold in the top 5;
    # q2 fuses [d5, d6] and [d3] -> d5, d3, d6 -> found.
    assert summary["recall@5_chain_rrf"] == pytest.approx(100.0)
    partial = score_records(EXAMPLES, [_record("q1", "Ostrel", [], [], 0), _record("q2", "no", [], [], 0)])
    assert partial["em"] == 0.0 and partial["f1"] == pytest.approx(100 * (2 / 3) / 2)


@pytest.mark.parametrize(
    ("lines", "field", "message"),
    [
        ([{"query_id": "q1", "predictions": "x"}], "query_id", "no prediction"),
        (
            [{"query_id": "q1", "predictions": "x"}, {"query_id": "q1", "predictions": "y"}],
            "query_id",
            "duplicate",
        ),
        (
            [{"query_id": "q1", "predictions": 3}, {"query_id": "q2", "predictions": "y"}],
            "predictions",
            "string",
        ),
        ([{"query_id": 1, "predictions": "x"}], "query_id", "string query id"),
        ([{"query_id": "q9", "predictions": "x"}], "query_id", "not in the dataset"),
        ([{"query_id": "q1", "predictions": "x", "usage": {"total_tokens": "many"}}], "usage", "integer"),
    ],
)
def test_bad_prediction_files_get_one_clear_error(tmp_path, lines, field, message):
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(InputError, match=message) as err:
        read_predictions(path, EXAMPLES)
    assert str(path) in str(err.value) and repr(field) in str(err.value)


def test_an_interrupted_evaluation_resumes_where_it_stopped(toy_world, toy_dir, short_model_dir, tmp_path):
    examples = toy_world.test[:4]
    lm = load_lm(short_model_dir)
    retriever = BM25Retriever.from_passages(list(toy_world.passages))
    corpus = Corpus.load(toy_dir / "corpus.jsonl")
    run = Run("greedy", (("max_steps", 1),))
    full = run_method(run, examples, lm, retriever, corpus, tmp_path / "full.jsonl", progress=False)
    # A crash left two whole records and half of a third.
    lines = (tmp_path / "full.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "cut.jsonl").write_text("".join(lines[:2]) + lines[2][: len(lines[2]) // 2])
    resumed = run_method(run, examples, lm, retriever, corpus, tmp_path / "cut.jsonl", progress=False)
    assert resumed == full
    assert len((tmp_path / "cut.jsonl").read_text().splitlines()) == len(examples)


def test_tables_and_plot(tmp_path):
    results = {
        "greedy:L=1": {"em": 10.0, "f1": 12.0, "cover_em": 11.0, "tokens_per_question": 500.0, "calls_per_question": 3.0, "em_by_hops": {"2": 20.0, "3": 0.0}},
        "best_of_n:L=1:N=4": {"em": 15.0, "f1": 18.0, "cover_em": 16.0, "tokens_per_question": 2000.0, "calls_per_question": 9.0, "em_by_hops": {"2": 25.0, "3": 5.0}},
    }  # fmt: skip
    paths = write_results(results, tmp_path)
    table = paths["table"].read_text().splitlines()
    assert (
        table[0]
        == "| run | em | f1 | cover_em | tokens_per_question | calls_per_question | em_2hop | em_3hop |"
    )
    assert table[3].startswith("| best_of_n:L=1:N=4 | 15.0 | 18.0 |")
    assert paths["plot"].read_bytes()[:4] == b"\x89PNG"


def test_kilt_submission_from_predictions_validates(shared_data, tmp_path):
    gold_lines = (shared_data / "kilt" / "hotpotqa-dev-kilt.sample.jsonl").read_text().splitlines()[:5]
    gold = tmp_path / "hotpotqa-dev-kilt.jsonl"
    gold.write_text("\n".join(gold_lines) + "\n")
    examples = load_examples(gold, "kilt")
    corpus_path = tmp_path / "corpus.jsonl"
    corpus_path.write_text(json.dumps({"id": "p0", "title": "Some Page", "contents": "text"}) + "\n")
    records = [{"query_id": e.id, "predictions": e.answers[0], "context_doc_ids": ["p0"]} for e in examples]
    page_ids = tmp_path / "pages.json"
    page_ids.write_text(json.dumps({"Some Page": "12345"}))
    write_kilt_submission(tmp_path / "sub.jsonl", records, Corpus.load(corpus_path), page_ids)
    pairs = validate_submission(tmp_path / "sub.jsonl", gold)
    assert [g["id"] for g, _ in pairs] == [e.id for e in examples]
    assert pairs[0][1]["output"][0]["provenance"] == [{"wikipedia_id": "12345"}]
