"""The evaluation stage: run specs, prediction files, scores, resume, tables and KILT submissions."""

from __future__ import annotations

import json
import os
import signal

import pytest

from corag.cli import main as cli_main
from corag.cluster.stop import StopRequest
from corag.data.corpus import Corpus
from corag.data.formats import load_examples
from corag.data.jsonl import JsonlAppender, write_jsonl
from corag.errors import InputError
from corag.evaluation import (
    Run,
    merged_results,
    parse_runs,
    read_predictions,
    run_method,
    score_records,
    write_results,
)
from corag.kilt import validate_submission, write_kilt_submission
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
        ([{"query_id": None, "predictions": "x"}], "query_id", "string or integer query id"),
        ([{"query_id": "q9", "predictions": "x"}], "query_id", "not in the dataset"),
        ([{"query_id": "q1", "predictions": "x", "usage": {"total_tokens": "many"}}], "usage", "integer"),
    ],
)
def test_bad_prediction_files_get_one_clear_error(tmp_path, lines, field, message):
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(InputError, match=message) as err:
        read_predictions(path, EXAMPLES, require_all=True)
    assert str(path) in str(err.value) and repr(field) in str(err.value)


def greedy_on_the_toy_world(toy_world, toy_dir, short_model_dir) -> tuple:
    """The short model, BM25 over the toy corpus, the corpus, and a one-step greedy run."""
    lm = load_lm(short_model_dir)
    retriever = BM25Retriever.from_passages(list(toy_world.passages))
    corpus = Corpus.load(toy_dir / "corpus.jsonl")
    return lm, retriever, corpus, Run("greedy", (("max_steps", 1),))


def test_an_interrupted_evaluation_resumes_where_it_stopped(toy_world, toy_dir, short_model_dir, tmp_path):
    examples = toy_world.test[:4]
    lm, retriever, corpus, run = greedy_on_the_toy_world(toy_world, toy_dir, short_model_dir)
    full = run_method(run, examples, lm, retriever, corpus, tmp_path / "full.jsonl", progress=False)
    # A crash left two whole records and half of a third; the rest is resumed with the asyncio executor.
    lines = (tmp_path / "full.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "cut.jsonl").write_text("".join(lines[:2]) + lines[2][: len(lines[2]) // 2])
    cut = tmp_path / "cut.jsonl"
    resumed = run_method(run, examples, lm, retriever, corpus, cut, progress=False, executor="async")
    assert resumed == full
    assert len((tmp_path / "cut.jsonl").read_text().splitlines()) == len(examples)


class StopAfter(JsonlAppender):
    """A predictions file that sets `stop` (Slurm's warning) once it holds `lines` new records."""

    stop = StopRequest()
    lines = 2

    def append(self, record) -> None:
        super().append(record)
        StopAfter.lines -= 1
        if StopAfter.lines == 0:
            StopAfter.stop.received = True


def test_a_warning_mid_run_stops_after_whole_questions_and_a_rerun_answers_the_rest(
    toy_world, toy_dir, short_model_dir, tmp_path, monkeypatch
):
    examples = toy_world.test[:5]
    lm, retriever, corpus, run = greedy_on_the_toy_world(toy_world, toy_dir, short_model_dir)
    full = run_method(run, examples, lm, retriever, corpus, tmp_path / "full.jsonl", progress=False)
    warned = tmp_path / "warned.jsonl"
    monkeypatch.setattr("corag.evaluation.JsonlAppender", StopAfter)
    stop = StopAfter.stop
    # Two questions in flight at a time: the warning comes with the second record, and the one in flight
    # is abandoned; the file holds the two whole lines.
    kept = run_method(run, examples, lm, retriever, corpus, warned, progress=False, max_active=2, stop=stop)
    assert kept is None
    lines = warned.read_text().splitlines(keepends=True)
    assert len(lines) == 2 and all(line.endswith("}\n") for line in lines)
    # Warned before it starts: no question is answered.
    assert run_method(run, examples, lm, retriever, corpus, warned, progress=False, stop=stop) is None
    assert warned.read_text().splitlines(keepends=True) == lines
    stop.received = False
    resumed = run_method(run, examples, lm, retriever, corpus, warned, progress=False, stop=stop)
    assert resumed == full
    ids = [json.loads(line)["query_id"] for line in warned.read_text().splitlines()]
    assert ids == [e.id for e in examples]  # every question once, in question order
    assert warned.read_bytes() == (tmp_path / "full.jsonl").read_bytes()


@pytest.fixture
def warning_handler():
    """`corag evaluate` installs its handler for Slurm's warning signal: the test's own is put back."""
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_a_part_warned_mid_run_exits_stopped_and_its_rerun_merges_into_the_one_process_files(
    toy_world, toy_dir, short_model_dir, tmp_path, capsys, monkeypatch, warning_handler
):
    """SIGUSR1 (Slurm's warning, passed on by srun) reaches `corag evaluate --shard`: the part ends after
    the question in hand with status 75 (stopped), whole lines and no metrics for the unfinished run, and
    the later run not started; the merge refuses it; run again, it resumes, and the merged predictions are
    the one-process run's, every question once."""
    from corag.retrieval.bm25 import build_bm25_folder

    build_bm25_folder([toy_world.passages], tmp_path / "bm25")
    common = ["--model", short_model_dir, "--data", toy_dir / "test.jsonl", "--corpus", toy_dir / "corpus.jsonl",
              "--retriever", tmp_path / "bm25", "--limit", 6, "--methods", "greedy:L=1",
              "no_retrieval:reader_max_new_tokens=4", "--max_active", 1]  # fmt: skip
    runs = ["greedy_L1", "no_retrieval_reader_max_new_tokens4"]
    one, split = tmp_path / "one", tmp_path / "split"
    assert evaluate(capsys, *common, "--out-dir", one)[0] == 0
    parts = [*common, "--out-dir", split, "--num-shards", 2]
    part0 = split / "parts" / "part-00000-of-00002"

    class Warned(JsonlAppender):
        def append(self, record) -> None:  # the warning comes as the first answer is written
            super().append(record)
            os.kill(os.getpid(), signal.SIGUSR1)

    with monkeypatch.context() as patch:
        patch.setattr("corag.evaluation.JsonlAppender", Warned)
        status, err = evaluate(capsys, *parts, "--shard", 0)
    assert status == 75, err
    assert (
        "stopped on the warning signal after part 0 of 2, run greedy:L=1: 1 of 3 question(s) answered" in err
    )
    lines = (part0 / runs[0] / "predictions.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 1 and lines[0].endswith("}\n")
    assert not (part0 / runs[0] / "metrics.json").exists() and not (part0 / runs[1]).exists()
    assert evaluate(capsys, *parts, "--shard", 1)[0] == 0
    status, err = evaluate(capsys, *parts, "--merge")
    assert status == 2 and "part 0 of 2 is unfinished: 2 of its 3 question(s) unanswered" in err, err

    assert evaluate(capsys, *parts, "--shard", 0)[0] == 0  # the rerun resumes
    assert evaluate(capsys, *parts, "--merge")[0] == 0
    for run in runs:
        merged = (split / run / "predictions.jsonl").read_bytes()
        assert merged == (one / run / "predictions.jsonl").read_bytes()
        ids = [json.loads(line)["query_id"] for line in merged.splitlines()]
        assert ids == [e.id for e in toy_world.test[:6]]


def test_a_part_begun_after_the_warning_stops_before_it_loads_anything(
    toy_world, toy_dir, short_model_dir, tmp_path, capsys, monkeypatch, warning_handler
):
    """The warning came before this part began (between two files of a Slurm part, which never saw the
    signal): the batch shell's warning file says so, and the part exits stopped without loading the corpus
    or the model and without writing; unwarned, the same part answers."""
    from corag.retrieval.bm25 import build_bm25_folder

    build_bm25_folder([toy_world.passages], tmp_path / "bm25")
    part = ["--model", short_model_dir, "--data", toy_dir / "test.jsonl", "--corpus", toy_dir / "corpus.jsonl",
            "--retriever", tmp_path / "bm25", "--limit", 4, "--methods", "greedy:L=1",
            "--out-dir", tmp_path / "out", "--num-shards", 2, "--shard", 1]  # fmt: skip
    warned = tmp_path / "warned-7"
    warned.write_text("warned\n")
    monkeypatch.setenv("CORAG_WARNED_FILE", str(warned))
    with monkeypatch.context() as patch:
        patch.setattr(Corpus, "load", lambda *a, **k: pytest.fail("loaded the corpus after the warning"))
        status, err = evaluate(capsys, *part)
    assert status == 75, err
    assert "after part 1 of 2, no question (warned before anything loaded)" in err
    assert not list((tmp_path / "out").rglob("predictions.jsonl"))
    warned.unlink()
    assert evaluate(capsys, *part)[0] == 0
    (answers,) = (tmp_path / "out").rglob("predictions.jsonl")
    assert len(answers.read_text().splitlines()) == 2


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


def test_one_table_over_datasets_with_the_papers_figures_where_it_has_them(tmp_path):
    with pytest.raises(InputError, match="no <dataset>/<run>/metrics.json"):
        merged_results(tmp_path)
    for dataset, run, em in [("musique_validation", "best_of_n:L=6:N=4", 26.0), ("test", "greedy:L=2", 40.0),
                             ("musique_validation", "greedy:L=6", 25.5)]:  # fmt: skip
        folder = tmp_path / dataset / run.replace(":", "_").replace("=", "")
        folder.mkdir(parents=True)
        summary = {"run": run, "count": 10, "em": em, "f1": em + 10, "finished_at": f"2026-12-05T{em}"}
        (folder / "metrics.json").write_text(json.dumps(summary))
    table = merged_results(tmp_path).read_text().splitlines()
    assert table[0] == (
        "| dataset | run | count | em | paper_em | f1 | paper_f1 | tokens_per_question | calls_per_question |"
    )
    assert table[2:] == [  # data sets in name order, each one's runs in the order they finished
        "| musique_validation | greedy:L=6 | 10 | 25.5 | 27.7 | 35.5 | 38.5 |  |  |",
        "| musique_validation | best_of_n:L=6:N=4 | 10 | 26.0 | 28.1 | 36.0 | 39.7 |  |  |",
        "| test | greedy:L=2 | 10 | 40.0 |  | 50.0 |  |  |  |",
    ]
    assert (tmp_path / "results.csv").read_text().startswith("dataset,run,count,em,paper_em,f1,paper_f1,")


def test_kilt_page_metrics_count_every_question_and_cite_what_the_submission_cites():
    """KILT's eval_retrieval / eval_downstream average over every question: one without gold provenance
    counts 0 (R-precision and KILT-*). The pages scored are those of `context_doc_ids`, the ones the
    submission cites, never a step's documents. Expected values by hand, for four NQ questions:
      q1: gold page 10, cites page 10, answer right -> Rprec 1, KILT-EM 1
      q2: gold page 20, cites page 30, answer right -> Rprec 0, KILT-EM 0
      q3: no gold provenance, cites page 10, right  -> Rprec 0, KILT-EM 0 (KILT counts it)
      q4: gold page 20, cites nothing (its step found page 20), right -> Rprec 0, KILT-EM 0
    so Rprec = 1/4, KILT-EM = 1/4, EM = 4/4 (in points: 25, 25, 100)."""
    page_of = {"d10": "10", "d20": "20", "d30": "30"}
    examples = [
        Example("q1", "who?", ("Ann",), task="nq", supporting_pages=("10",)),
        Example("q2", "who?", ("Bob",), task="nq", supporting_pages=("20",)),
        Example("q3", "who?", ("Cy",), task="nq"),
        Example("q4", "who?", ("Di",), task="nq", supporting_pages=("20",)),
    ]
    records = [
        {"predictions": "Ann", "context_doc_ids": ["d10"]},
        {"predictions": "Bob", "context_doc_ids": ["d30"]},
        {"predictions": "Cy", "context_doc_ids": ["d10"]},
        {"predictions": "Di", "context_doc_ids": [], "steps": [{"doc_ids": ["d20"]}]},
    ]
    summary = score_records(examples, records, pages=lambda ids: [page_of[i] for i in ids])
    assert summary["em"] == 100.0
    assert summary["Rprec_question"] == pytest.approx(25.0)
    assert summary["KILT-em"] == pytest.approx(25.0) and summary["KILT-accuracy"] == pytest.approx(25.0)
    assert summary["page_recall@5_question"] == pytest.approx(25.0)
    # Every record with gold provenance (q3 left out): Rprec = KILT-EM = 1/3.
    kept = [0, 1, 3]
    summary = score_records(
        [examples[i] for i in kept], [records[i] for i in kept], pages=lambda ids: [page_of[i] for i in ids]
    )
    assert summary["Rprec_question"] == pytest.approx(100 / 3) and summary["KILT-em"] == pytest.approx(
        100 / 3
    )


def test_kilt_submission_from_predictions_validates(shared_data, tmp_path):
    gold_lines = (shared_data / "kilt" / "hotpotqa-dev-kilt.sample.jsonl").read_text().splitlines()[:5]
    gold = tmp_path / "hotpotqa-dev-kilt.jsonl"
    gold.write_text("\n".join(gold_lines) + "\n")
    examples = load_examples(gold, "kilt")
    corpus_path = tmp_path / "corpus.jsonl"
    corpus_path.write_text(json.dumps({"id": "p0", "title": "Some Page", "contents": "text"}) + "\n")
    records = [{"query_id": e.id, "predictions": e.answers[0], "context_doc_ids": ["p0"]} for e in examples]
    ids = [e.id for e in examples]
    write_kilt_submission(
        tmp_path / "sub.jsonl", ids, records, Corpus.load(corpus_path), {"Some Page": "12345"}
    )
    pairs = validate_submission(tmp_path / "sub.jsonl", gold)
    assert [g["id"] for g, _ in pairs] == [e.id for e in examples]
    assert pairs[0][1]["output"][0]["provenance"] == [{"wikipedia_id": "12345"}]


# Real files end to end: official formats, tasks, official rules, missing predictions -----------------

HOTPOT = "hotpotqa/hotpot_dev_distractor_sample.json"
TWOWIKI = "2wikimultihopqa/2wiki_dev_sample.json"
MUSIQUE = "musique/musique_ans_v1.0_dev_sample.jsonl"
KILT = "kilt/hotpotqa-dev-kilt.sample.jsonl"


def evaluate(capsys, *args) -> tuple[int, str]:
    """`corag evaluate ARGS` through the command wrapper: (status, stderr)."""
    status = cli_main(["evaluate", *map(str, args)])
    return status, capsys.readouterr().err


def metrics_of(out_dir) -> dict:
    return json.loads((out_dir / "metrics.json").read_text())


def _noisy(examples) -> list[str]:
    """Predictions right, right but differently written, wrong, or half right, in turn."""
    out = []
    for i, e in enumerate(examples):
        gold = e.answers[0]
        out.append([gold, f"The {gold.upper()}!", "Paris", gold.split()[0] + " x"][i % 4])
    return out


def _ours(path, examples, predictions) -> None:
    write_jsonl(
        path,
        [
            {"query_id": e.id, "predictions": p, "usage": {"total_tokens": 100 + i}, "model_calls": 3}
            for i, (e, p) in enumerate(zip(examples, predictions, strict=True))
        ],
    )


def test_an_official_prediction_file_scores_as_the_same_predictions_in_ours(shared_data, tmp_path, capsys):
    examples = load_examples(shared_data / MUSIQUE)
    predictions = _noisy(examples)
    _ours(tmp_path / "ours.jsonl", examples, predictions)
    official = tmp_path / "preds_greedy_musique_validation.jsonl"
    write_jsonl(
        official,
        [
            {"query": e.query, "answers": list(e.answers), "query_id": e.id, "task_desc": "answer multi-hop questions",
             "prediction": p, "subqueries": [], "subanswers": []}
            for e, p in zip(examples, predictions, strict=True)
        ],
    )  # fmt: skip
    for rules in ("official", "corag"):
        assert evaluate(capsys, "--data", shared_data / MUSIQUE, "--predictions", tmp_path / "ours.jsonl",
                        "--out-dir", tmp_path / "a", "--rules", rules)[0] == 0  # fmt: skip
        assert evaluate(capsys, "--data", shared_data / MUSIQUE, "--predictions", official,
                        "--out-dir", tmp_path / "b", "--rules", rules)[0] == 0  # fmt: skip
        ours, theirs = metrics_of(tmp_path / "a"), metrics_of(tmp_path / "b")
        for key in ("em", "f1", "cover_em", "count", "num_samples", "missing"):
            assert ours[key] == theirs[key], (rules, key)
    # a quarter exactly right, a quarter right after normalisation: EM at least half
    assert 50.0 <= ours["em"] < 75.0 and ours["eval_task"] == "musique" and ours["eval_split"] == "dev"


def test_search_r1_rules_score_every_task_by_its_em(shared_data, tmp_path, capsys):
    from corag.evaluation import RULE_CHOICES, rule_of

    example = Example("q", "Is it?", ("yes",), task="hotpotqa")
    assert "search-r1" in RULE_CHOICES and rule_of(example, "search-r1") == "search-r1"
    assert rule_of(example, "official") == "hotpotqa"
    examples = load_examples(shared_data / MUSIQUE)
    _ours(tmp_path / "ours.jsonl", examples, _noisy(examples))
    for rules in ("search-r1", "corag"):
        assert evaluate(capsys, "--data", shared_data / MUSIQUE, "--predictions", tmp_path / "ours.jsonl",
                        "--out-dir", tmp_path / rules, "--rules", rules)[0] == 0  # fmt: skip
    ours, corag = metrics_of(tmp_path / "search-r1"), metrics_of(tmp_path / "corag")
    assert ours["rule"] == "search-r1" and ours["em"] == corag["em"] and ours["f1"] == corag["f1"]


def test_official_files_written_beside_ours_read_back_the_same(shared_data, tmp_path, capsys):
    from corag.evaluation import write_official_files

    examples = load_examples(shared_data / MUSIQUE)
    predictions = _noisy(examples)
    records = [
        {"query_id": e.id, "predictions": p, "subqueries": ["q"], "subanswers": ["a"],
         "usage": {"total_tokens": 1000}, "model_calls": 13}
        for e, p in zip(examples, predictions, strict=True)
    ]  # fmt: skip
    paths = write_official_files(
        tmp_path, Run("greedy", (("max_steps", 6),)), examples, records, "validation"
    )
    assert [p.name for p in paths] == [
        "preds_greedy_musique_validation.jsonl",
        "metrics_musique_validation_greedy.json",
    ]
    official = json.loads(paths[1].read_text())
    assert set(official) == {"em", "f1", "num_samples", "eval_task", "eval_split", "max_path_length",
                             "decode_strategy", "token_consumed", "average_token_consumed_per_sample"}  # fmt: skip
    assert (official["num_samples"], official["token_consumed"]) == (120, 120_000)
    assert official["average_token_consumed_per_sample"] == 1000.0 and official["max_path_length"] == 6
    line = json.loads(paths[0].read_text().splitlines()[0])
    assert list(line) == [
        "query",
        "answers",
        "query_id",
        "task_desc",
        "prediction",
        "subqueries",
        "subanswers",
    ]
    assert evaluate(capsys, "--data", shared_data / MUSIQUE, "--predictions", paths[0], "--out-dir", tmp_path / "m",
                    "--rules", "corag")[0] == 0  # fmt: skip
    again = metrics_of(tmp_path / "m")
    assert official["em"] == round(again["em"], 3) and official["f1"] == round(again["f1"], 3)
    assert again["token_consumed"] == 0  # the official file carries no usage
    assert write_official_files(tmp_path, Run("greedy", (("max_steps", 0),)), examples, records, "dev")[
        0
    ].name == ("preds_greedy_musique_dev.jsonl")


def test_a_missing_prediction_counts_0_with_a_warning(shared_data, tmp_path, capsys):
    examples = load_examples(shared_data / HOTPOT)
    _ours(tmp_path / "p.jsonl", examples[3:], [e.answers[0] for e in examples[3:]])
    status, err = evaluate(capsys, "--data", shared_data / HOTPOT, "--predictions", tmp_path / "p.jsonl",
                           "--out-dir", tmp_path / "o")  # fmt: skip
    assert status == 0 and f"no prediction for 3 of {len(examples)} question(s)" in err
    metrics = metrics_of(tmp_path / "o")
    assert metrics["em"] == pytest.approx(100 * (len(examples) - 3) / len(examples))
    assert (metrics["missing"], metrics["count"], metrics["answered"]) == (3, 103, 103)
    status, err = evaluate(capsys, "--data", shared_data / HOTPOT, "--predictions", tmp_path / "p.jsonl",
                           "--out-dir", tmp_path / "o", "--require-all")  # fmt: skip
    assert status == 2 and err.count("\n") == 1
    assert "field 'query_id': no prediction for 3 question(s)" in err and repr(examples[0].id) in err


def test_2wiki_aliases_demonyms_and_empty_aliases_score_as_the_official_script(shared_data, tmp_path, capsys):
    """Expected values worked out by hand from 2wikimultihop_evaluate_v1.1.py: the gold set is the
    answer plus the id's aliases and demonyms; F1 is 0 against an empty gold and for yes/no mismatches."""
    records = json.loads((shared_data / TWOWIKI).read_text(encoding="utf-8"))
    picked = [records[i] for i in (0, 4, 6, 9, 14, 11)]
    assert [r["answer"] for r in picked] == [
        "Free Guy",
        "Montreal, Quebec",
        "Lancashire",
        "Flora",
        "Buenos Aires",
        "yes",
    ]
    (tmp_path / "dev.json").write_text(json.dumps(picked), encoding="utf-8")
    write_jsonl(tmp_path / "id_aliases.json", [
        {"Q_id": "Q38685497", "aliases": ["Free Guy (film)"], "demonyms": []},
        {"Q_id": "Q340", "aliases": ["Montréal", ""], "demonyms": ["Montrealer"]},
        {"Q_id": "Q23077", "aliases": ["County Palatine of Lancaster", ""], "demonyms": []},
        {"Q_id": "Q493811", "aliases": [""], "demonyms": []},
    ])  # fmt: skip
    predictions = ["free guy film", "Montrealer", "", "The", "", "yes indeed"]
    _ours(tmp_path / "p.jsonl", load_examples(tmp_path / "dev.json"), predictions)
    base = [
        "--data",
        tmp_path / "dev.json",
        "--predictions",
        tmp_path / "p.jsonl",
        "--out-dir",
        tmp_path / "o",
    ]
    assert evaluate(capsys, *base, "--aliases", tmp_path / "id_aliases.json")[0] == 0
    with_aliases = metrics_of(tmp_path / "o")
    # EM: alias, demonym, empty alias (twice: "" and "The" normalise to nothing) -> 4 of 6
    assert with_aliases["em"] == pytest.approx(100 * 4 / 6)
    # F1: 1 for the alias and the demonym; 0 against an empty gold; "yes indeed" vs "yes" is 0 (yes/no rule)
    assert with_aliases["f1"] == pytest.approx(100 * 2 / 6)
    assert evaluate(capsys, *base)[0] == 0
    without = metrics_of(tmp_path / "o")
    # only "free guy film" vs "Free Guy" overlaps: P 2/3, R 1, F1 0.8
    assert without["em"] == 0.0 and without["f1"] == pytest.approx(100 * 0.8 / 6)
    assert evaluate(capsys, *base, "--aliases", tmp_path / "id_aliases.json", "--rules", "corag")[0] == 0
    # the CoRAG paper's SQuAD F1 has no yes/no rule: "yes indeed" vs "yes" gives 2/3
    assert metrics_of(tmp_path / "o")["f1"] == pytest.approx(100 * (2 + 2 / 3) / 6)
    status, err = evaluate(capsys, *base, "--aliases", tmp_path / "missing.json")
    assert status == 2 and "missing.json: no such file" in err


def _kilt_answers(examples) -> list[str]:
    """Yes/no answers with more words (KILT gives partial F1, HotpotQA's rule 0), every other answer
    with a trailing space or newline (KILT strips it)."""
    out = []
    for i, e in enumerate(examples):
        gold = e.answers[0]
        out.append(f"{gold}, I think" if gold in ("yes", "no") else gold + (" " if i % 2 else "\n"))
    return out


def test_kilt_files_score_by_kilt_rules_yes_no_and_trailing_whitespace(shared_data, tmp_path, capsys):
    from corag.evaluation import answer_row
    from corag.kilt import KiltPrediction, score_submission, write_submission
    from corag.metrics import rouge_l

    examples = load_examples(shared_data / KILT)
    answers = _kilt_answers(examples)
    _ours(tmp_path / "p.jsonl", examples, answers)
    assert evaluate(capsys, "--data", shared_data / KILT, "--predictions", tmp_path / "p.jsonl",
                    "--out-dir", tmp_path / "o")[0] == 0  # fmt: skip
    ours = metrics_of(tmp_path / "o")
    write_submission(
        tmp_path / "sub.jsonl", [KiltPrediction(e.id, a) for e, a in zip(examples, answers, strict=True)]
    )
    kilt = score_submission(tmp_path / "sub.jsonl", shared_data / KILT)["downstream"]
    for key in ("accuracy", "em", "f1", "rougel"):
        assert ours[key] == pytest.approx(100 * kilt[key]), key
    assert ours["accuracy"] == pytest.approx(
        100 * sum(e.answers[0] not in ("yes", "no") for e in examples) / 1000
    )
    # by hand: "yes, I think" against "yes" shares one of three tokens: F1 2 * (1/3) / (1/3 + 1) = 0.5
    yes = next(e for e in examples if e.answers == ("yes",))
    assert answer_row("yes, I think", yes, "kilt")["f1"] == 0.5
    assert answer_row("yes, I think", yes, "hotpotqa")["f1"] == 0.0
    assert answer_row("Miami Gardens, Florida,\n", examples[-1], "kilt")["rougel"] == pytest.approx(1.0)
    # how many of the 1000 pairs the wrong rules would have scored differently
    f1_disagree = sum(
        answer_row(a, e, "kilt")["f1"] != answer_row(a, e, "hotpotqa")["f1"]
        for e, a in zip(examples, answers, strict=True)
    )
    rouge_disagree = sum(rouge_l(a, e.answers[0]) != rouge_l(a.strip(), e.answers[0]) for e, a in zip(examples, answers, strict=True))  # fmt: skip
    assert f1_disagree == sum(e.answers[0] in ("yes", "no") for e in examples) and rouge_disagree > 0
    print(f"yes/no F1 disagreements {f1_disagree}, unstripped ROUGE-L disagreements {rouge_disagree}")


def test_a_kilt_split_named_like_the_hubs_gets_its_task_from_the_data_or_task(shared_data, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    examples = load_examples(shared_data / KILT)[:200]
    rows = [
        {"query": e.query, "answers": list(e.answers), "query_id": e.id, "context_doc_ids": []}
        for e in examples
    ]
    lone = tmp_path / "validation-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows), lone)
    answers = _kilt_answers(examples)
    _ours(tmp_path / "p.jsonl", examples, answers)
    base = ["--predictions", tmp_path / "p.jsonl", "--out-dir", tmp_path / "o"]
    status, err = evaluate(capsys, "--data", lone, *base)
    assert status == 2 and "pass --task" in err and err.count("\n") == 1
    assert evaluate(capsys, "--data", lone, "--task", "kilt_hotpotqa", *base)[0] == 0
    by_task = metrics_of(tmp_path / "o")
    assert by_task["eval_task"] == "hotpotqa" and "rougel" in by_task and "accuracy" in by_task
    assert len((tmp_path / "o" / "kilt_submission.jsonl").read_text().splitlines()) == 200
    hub = tmp_path / "kilt" / "hotpotqa" / "validation-00000-of-00001.parquet"
    hub.parent.mkdir(parents=True)
    hub.write_bytes(lone.read_bytes())
    assert evaluate(capsys, "--data", hub, *base)[0] == 0
    assert metrics_of(tmp_path / "o")["f1"] == by_task["f1"]
    pq.write_table(pa.Table.from_pylist([{**r, "task": "kilt_hotpotqa"} for r in rows]), lone)
    assert evaluate(capsys, "--data", lone, *base)[0] == 0
    assert metrics_of(tmp_path / "o")["f1"] == by_task["f1"]
    # named as the original HotpotQA instead, its yes/no rule applies: a different F1
    assert evaluate(capsys, "--data", lone, "--task", "hotpotqa", *base)[0] == 0
    assert metrics_of(tmp_path / "o")["f1"] < by_task["f1"]


def _knowledge_source(path, pages) -> None:
    path.write_text(
        "".join(
            json.dumps({"_id": p, "wikipedia_id": p, "wikipedia_title": t, "text": [t + "\n", "..."]}) + "\n"
            for p, t in pages
        ),
        encoding="utf-8",
    )


def test_a_kilt_test_file_without_answers_yields_a_valid_submission(shared_data, tmp_path, capsys):
    from corag.kilt import score_submission

    gold_lines = (shared_data / KILT).read_text(encoding="utf-8").splitlines()[:50]
    gold = tmp_path / "hotpotqa-dev-kilt.jsonl"
    gold.write_text("\n".join(gold_lines) + "\n", encoding="utf-8")
    golds = [json.loads(line) for line in gold_lines]
    test_file = tmp_path / "hotpotqa-test_without_answers-kilt.jsonl"
    write_jsonl(test_file, [{"id": g["id"], "input": g["input"]} for g in golds])
    gold_pages = {}  # the gold pages of each question, in provenance order
    for g in golds:
        pages = [(str(p["wikipedia_id"]), p["title"]) for o in g["output"] for p in o.get("provenance", [])]
        gold_pages[g["id"]] = list(dict.fromkeys(pages))
    every_page = list(dict.fromkeys(p for pages in gold_pages.values() for p in pages))
    distractor = ("99000001", "A Distractor Page")
    _knowledge_source(tmp_path / "ks.json", [*every_page, distractor])
    assert cli_main(["kilt-pages", str(tmp_path / "ks.json"), "--out", str(tmp_path / "pages.json")]) == 0
    # the corpus: two passages of every page (rows 2i and 2i + 1), then the distractor
    rows = {}
    with (tmp_path / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for i, (_, title) in enumerate([*every_page, distractor]):
            rows[title] = [str(2 * i), str(2 * i + 1)]
            for part in ("one", "two"):
                f.write(json.dumps({"title": title, "contents": f"{title}: part {part}"}) + "\n")
    predictions, expected_rprec = [], []
    for i, g in enumerate(golds):
        cited = [r for _, title in gold_pages[g["id"]] for r in rows[title]]
        if i % 2:  # the distractor first: one of the R first pages is wrong
            cited = [rows[distractor[1]][0], *cited]
            expected_rprec.append((len(gold_pages[g["id"]]) - 1) / len(gold_pages[g["id"]]))
        else:
            expected_rprec.append(1.0)
        answer = g["output"][0]["answer"] if i % 2 == 0 else ""
        predictions.append({"query_id": g["id"], "predictions": answer, "context_doc_ids": cited})
    write_jsonl(tmp_path / "p.jsonl", predictions)
    status, _ = evaluate(capsys, "--data", test_file, "--predictions", tmp_path / "p.jsonl", "--out-dir",
                         tmp_path / "o", "--corpus", tmp_path / "corpus.jsonl", "--page-ids", tmp_path / "pages.json")  # fmt: skip
    assert status == 0
    metrics = metrics_of(tmp_path / "o")
    assert metrics["answered"] == 0 and "em" not in metrics and metrics["count"] == 50
    submission = tmp_path / "o" / "kilt_submission.jsonl"
    pairs = validate_submission(submission, gold)  # every gold id, one answer each
    assert [guess["id"] for _, guess in pairs] == [g["id"] for g in golds]
    first = json.loads(submission.read_text().splitlines()[0])
    assert first["output"][0]["provenance"] == [{"wikipedia_id": p} for p, _ in gold_pages[golds[0]["id"]]]
    scores = score_submission(submission, gold)
    assert scores["retrieval"]["Rprec"] == pytest.approx(sum(expected_rprec) / 50)
    assert scores["kilt"]["KILT-em"] == pytest.approx(0.5) and scores["downstream"]["em"] == pytest.approx(
        0.5
    )


def test_kilt_page_ids_are_never_compared_with_passage_ids(shared_data, tmp_path):
    """The sample's gold page ids below 30,000 are also row numbers of a 30,000-row corpus: citing
    those rows cites unrelated passages, and must not count as finding the gold pages."""
    from corag.kilt import passage_pages

    examples = load_examples(shared_data / KILT)
    assert all(e.supporting_ids == () and e.supporting_pages for e in examples)
    with (tmp_path / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for row in range(30_000):
            f.write(json.dumps({"title": f"Row {row}", "contents": f"passage {row}"}) + "\n")
    corpus = Corpus.load(tmp_path / "corpus.jsonl")
    colliding = [e for e in examples if any(int(p) < 30_000 for p in e.supporting_pages)]
    assert len(colliding) >= 40  # e.g. Ed Wood's page id 10520 is row 10520 here
    records = [
        {"query_id": e.id, "predictions": e.answers[0],
         "context_doc_ids": [p for p in e.supporting_pages if int(p) < 30_000] or ["0"],
         "steps": [{"subquery": "s", "subanswer": "a", "doc_ids": [p for p in e.supporting_pages if int(p) < 30_000]}]}
        for e in examples
    ]  # fmt: skip
    summary = score_records(examples, records)
    assert not [k for k in summary if k.startswith("recall@")]  # no gold passage ids, no passage recall
    title_ids = {f"Row {r}": str(7_000_000 + r) for r in range(30_000)}
    pages = lambda ids: passage_pages(corpus.get_many(ids), title_ids)[0]  # noqa: E731
    with_pages = score_records(examples, records, pages=pages)
    assert with_pages["Rprec_question"] == 0.0 and with_pages["page_recall@5_chain_rrf"] == 0.0
    assert with_pages["KILT-em"] == 0.0 and with_pages["em"] == 100.0
    # with a map that says row r is page r (the rows stand for those pages), the same citations count
    title_ids.update({f"Row {p}": p for e in colliding for p in e.supporting_pages if int(p) < 30_000})
    kept = [r for r, e in zip(records, examples, strict=True) if e in colliding]
    right = score_records(colliding, kept, pages=pages)
    assert right["page_recall@5_question"] > 0.0


def test_evaluate_a_checkpoint_from_context_doc_ids_with_official_files(
    toy_world, toy_dir, short_model_dir, tmp_path, capsys
):
    """`corag evaluate` with a model: released-schema questions carrying context_doc_ids answer from
    exactly those documents, and the official files come beside ours."""
    from corag.retrieval.bm25 import build_bm25_folder

    build_bm25_folder([toy_world.passages], tmp_path / "bm25")
    ids = [p.id for p in toy_world.passages][:25][::-1]
    questions = [
        {
            "query": e.query,
            "answers": list(e.answers),
            "query_id": e.id,
            "context_doc_ids": ids,
            "task": "toy",
        }
        for e in toy_world.test[:3]
    ]
    write_jsonl(tmp_path / "validation.jsonl", questions)
    status, err = evaluate(capsys, "--model", short_model_dir, "--data", tmp_path / "validation.jsonl",
                           "--corpus", toy_dir / "corpus.jsonl", "--retriever", tmp_path / "bm25",
                           "--methods", "greedy:L=1", "--official-files", "--out-dir", tmp_path / "o")  # fmt: skip
    assert status == 0, err
    run = tmp_path / "o" / "greedy_L1"
    records = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert [r["context_doc_ids"] for r in records] == [ids[:20]] * 3
    assert {r["context_doc_source"] for r in records} == {"dataset"}
    metrics = metrics_of(run)
    assert (metrics["decode_strategy"], metrics["max_path_length"], metrics["eval_split"]) == (
        "greedy",
        1,
        "validation",
    )
    assert metrics["token_consumed"] == sum(r["usage"]["total_tokens"] for r in records)
    official = json.loads((run / "metrics_toy_validation_greedy.json").read_text())
    assert official["token_consumed"] == metrics["token_consumed"] and official["num_samples"] == 3
    preds = [
        json.loads(line) for line in (run / "preds_greedy_toy_validation.jsonl").read_text().splitlines()
    ]
    assert [p["prediction"] for p in preds] == [r["predictions"] for r in records]


def test_runs_of_separate_calls_meet_in_one_table_with_wall_time_and_settings(
    toy_world, toy_dir, short_model_dir, tmp_path, capsys
):
    from corag.retrieval.bm25 import build_bm25_folder

    build_bm25_folder([toy_world.passages], tmp_path / "bm25")
    common = ["--model", short_model_dir, "--data", toy_dir / "test.jsonl", "--corpus", toy_dir / "corpus.jsonl",
              "--retriever", tmp_path / "bm25", "--limit", 2, "--out-dir", tmp_path / "o"]  # fmt: skip
    assert evaluate(capsys, *common, "--methods", "no_retrieval:reader_max_new_tokens=4")[0] == 0
    assert evaluate(capsys, *common, "--methods", "greedy:L=1", "--budget", 5000)[0] == 0
    runs = ["no_retrieval:reader_max_new_tokens=4", "greedy:L=1"]
    table = (tmp_path / "o" / "results.md").read_text().splitlines()
    assert [line.split(" | ")[0].lstrip("| ") for line in table[2:]] == runs
    csv_runs = [line.split(",")[0] for line in (tmp_path / "o" / "results.csv").read_text().splitlines()[1:]]
    assert csv_runs == runs
    first = metrics_of(tmp_path / "o" / "no_retrieval_reader_max_new_tokens4")
    second = metrics_of(tmp_path / "o" / "greedy_L1")
    assert first["run"] == runs[0] and second["run"] == runs[1]
    assert first["wall_seconds"] > 0 and second["wall_seconds"] > 0
    assert first["finished_at"] < second["finished_at"]
    assert first["settings"]["method"] == "no_retrieval"
    assert first["settings"]["method_settings"] == {"reader_max_new_tokens": 4}
    assert second["settings"]["method_settings"] == {"max_steps": 1}
    assert second["settings"]["budget"] == 5000 and first["settings"]["budget"] is None
    assert second["settings"]["data"] == str(toy_dir / "test.jsonl") and second["settings"]["limit"] == 2
    for metrics in (first, second):
        assert {"empty_predictions", "answer_fallbacks", "parse_failures"} <= set(metrics)
    # the first run's parse counts are those of its records
    lines = (tmp_path / "o" / "no_retrieval_reader_max_new_tokens4" / "predictions.jsonl").read_text()
    records = [json.loads(line) for line in lines.splitlines()]
    assert first["parse_failures"] == sum(r["parse_failures"] for r in records)
    assert first["empty_predictions"] == sum(not r["predictions"].strip() for r in records)


def test_parse_counts_and_a_broken_metrics_file(tmp_path):
    from corag.evaluation import folder_results

    examples = [Example(f"q{i}", "Where?", ("Oslo",)) for i in range(4)]
    records = [
        {"query_id": "q0", "predictions": "Oslo", "answer_source": "format", "parse_failures": 0},
        {"query_id": "q1", "predictions": "In Oslo", "answer_source": "text", "parse_failures": 2},
        {"query_id": "q2", "predictions": " ", "answer_source": "none", "parse_failures": 1},
        {"query_id": "q3", "predictions": "Oslo"},  # CoRAG's records carry no parse fields
    ]
    summary = score_records(examples, records)
    assert (summary["empty_predictions"], summary["answer_fallbacks"], summary["parse_failures"]) == (1, 1, 3)
    (tmp_path / "run_a").mkdir()
    (tmp_path / "run_a" / "metrics.json").write_text('{"em": 1.0,')
    with pytest.raises(InputError, match="run_a"):
        folder_results(tmp_path)


def test_prediction_ids_may_be_integers_and_the_file_may_start_with_a_bom(tmp_path):
    """One id rule (a string or an integer, as KILT's files have) and one BOM rule for every loader."""
    questions = tmp_path / "q.jsonl"
    write_jsonl(
        questions, [{"id": str(i), "query": f"q{i}", "answers": [f"a{i}"], "task": "nq"} for i in (7, 8)]
    )
    examples = load_examples(questions)
    preds = tmp_path / "p.jsonl"
    lines = [
        json.dumps({"query_id": 7, "prediction": "a7"}),
        json.dumps({"query_id": "8", "prediction": "no"}),
    ]
    preds.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n")
    got = read_predictions(preds, examples)
    assert [r["prediction"] for r in got] == ["a7", "no"]
    preds.write_text(json.dumps({"query_id": True, "prediction": "a7"}) + "\n")
    with pytest.raises(InputError, match="expected a string or integer query id"):
        read_predictions(preds, examples)


def test_kilt_page_metrics_count_every_question_whatever_the_answer_rule(tmp_path, capsys):
    """KILT's kilt/eval_retrieval.py averages over every question of the gold file: one without gold
    provenance scores 0 (R-precision 0 when R is 0; recall@k 0 without an evidence set). That follows
    the task, not `--rules`. Four hand-made NQ records, pages cited through `context_doc_ids`:
      q1: one output, provenance pages 10 and 11 (R = 2); cites 10, 30 -> Rprec 1/2;
          recall@5: the set {10, 11} is never completed -> 0
      q2: two outputs, pages 20 | 21; cites 21 -> Rprec max(0/1, 1/1) = 1;
          recall@5: one of the two sets completed -> 1/2
      q3: an output without provenance; cites 10 -> 0 and 0
      q4: an output with an empty provenance list; cites 30 -> 0 and 0
    Rprec = (1/2 + 1 + 0 + 0) / 4 = 37.5 points, page recall@5 = (0 + 1/2 + 0 + 0) / 4 = 12.5 points,
    under `--rules official` and `--rules corag` alike (over q1 and q2 alone it would be 75 and 25).
    Every answer is right; KILT-EM (KILT's rule only) counts q2 alone: 1/4 = 25 points."""
    gold = [
        {"id": "q1", "input": "a?", "output": [{"answer": "Ann", "provenance": [{"wikipedia_id": "10"}, {"wikipedia_id": "11"}]}]},
        {"id": "q2", "input": "b?", "output": [{"answer": "Bob", "provenance": [{"wikipedia_id": "20"}]},
                                               {"answer": "Bob", "provenance": [{"wikipedia_id": "21"}]}]},
        {"id": "q3", "input": "c?", "output": [{"answer": "Cy"}]},
        {"id": "q4", "input": "d?", "output": [{"answer": "Di", "provenance": []}]},
    ]  # fmt: skip
    write_jsonl(tmp_path / "nq-dev-kilt.jsonl", gold)
    titles = {
        "10": "Page Ten",
        "11": "Page Eleven",
        "20": "Page Twenty",
        "21": "Page TwentyOne",
        "30": "Page Thirty",
    }
    (tmp_path / "pages.json").write_text(json.dumps({t: p for p, t in titles.items()}))
    write_jsonl(tmp_path / "corpus.jsonl", [{"title": t, "contents": f"{t} text"} for t in titles.values()])
    row = {p: str(i) for i, p in enumerate(titles)}  # page -> its passage's row in the corpus
    cites = {"q1": ["10", "30"], "q2": ["21"], "q3": ["10"], "q4": ["30"]}
    answers = {"q1": "Ann", "q2": "Bob", "q3": "Cy", "q4": "Di"}
    write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"query_id": q, "predictions": answers[q], "context_doc_ids": [row[p] for p in cites[q]]}
            for q in cites
        ],
    )
    for rules, rule in (("official", "kilt"), ("corag", "squad")):
        out = tmp_path / rules
        status, _ = evaluate(capsys, "--data", tmp_path / "nq-dev-kilt.jsonl", "--predictions", tmp_path / "p.jsonl",
                             "--out-dir", out, "--corpus", tmp_path / "corpus.jsonl",
                             "--page-ids", tmp_path / "pages.json", "--rules", rules)  # fmt: skip
        assert status == 0
        metrics = metrics_of(out)
        assert metrics["Rprec_question"] == pytest.approx(37.5), rules
        assert metrics["Rprec_chain_rrf"] == pytest.approx(37.5), rules
        assert metrics["page_recall@5_question"] == pytest.approx(12.5), rules
        assert (metrics["task"], metrics["rule"], metrics["em"]) == ("nq", rule, 100.0)
    assert metrics_of(tmp_path / "official")["KILT-em"] == pytest.approx(25.0)
    assert "KILT-em" not in metrics_of(tmp_path / "corag")
    # the submission written beside the metrics scores the same under KILT's scoring
    from corag.kilt import score_submission

    scores = score_submission(tmp_path / "corag" / "kilt_submission.jsonl", tmp_path / "nq-dev-kilt.jsonl")
    assert scores["retrieval"]["Rprec"] == pytest.approx(0.375)
    assert scores["retrieval"]["recall@5"] == pytest.approx(0.125)


@pytest.mark.parametrize("name", ["kilt-hotpotqa-validation.jsonl", "hotpotqa_kilt_validation.jsonl"])
def test_a_name_that_only_suggests_the_task_is_refused_and_metrics_name_task_and_rule(name, tmp_path, capsys):
    """Records of the shared question schema carry no KILT layout: whether a file named like KILT's
    HotpotQA holds HotpotQA (yes/no F1 rule) or KILT's HotpotQA (none) is asked, never guessed.
    By hand, two questions:
      h1: gold "yes", predicted "yes, I think": KILT F1 = 2 * (1/3 * 1) / (1/3 + 1) = 1/2 (one of three
          tokens); HotpotQA's rule: the gold is yes/no and the prediction differs -> 0
      h2: gold "Ann Lee", predicted "Ann": P = 1, R = 1/2 -> F1 2/3 under both
    F1 as KILT's HotpotQA (1/2 + 2/3) / 2 = 58.33 points; as HotpotQA (0 + 2/3) / 2 = 33.33; EM 0."""
    rows = [
        {"query_id": "h1", "query": "Is it?", "answers": ["yes"], "context_doc_ids": []},
        {"query_id": "h2", "query": "Who?", "answers": ["Ann Lee"], "context_doc_ids": []},
    ]
    data = tmp_path / name
    write_jsonl(data, rows)
    write_jsonl(tmp_path / "p.jsonl", [{"query_id": "h1", "predictions": "yes, I think"},
                                       {"query_id": "h2", "predictions": "Ann"}])  # fmt: skip
    base = ["--data", data, "--predictions", tmp_path / "p.jsonl", "--out-dir", tmp_path / "o"]
    status, err = evaluate(capsys, *base)
    assert status == 2 and err.count("\n") == 1 and "pass --task hotpotqa or --task kilt_hotpotqa" in err
    assert f"{name}, line 1, id 'h1', field 'task'" in err
    assert not (tmp_path / "o" / "metrics.json").exists()
    for task, rule, f1 in (("kilt_hotpotqa", "kilt", 100 * 7 / 12), ("hotpotqa", "hotpotqa", 100 / 3)):
        assert evaluate(capsys, *base, "--task", task)[0] == 0
        metrics = metrics_of(tmp_path / "o")
        assert (metrics["task"], metrics["rule"], metrics["rule_by_task"]) == (task, rule, {task: rule})
        assert metrics["f1"] == pytest.approx(f1) and metrics["em"] == 0.0
    # the same questions in KILT's layout say their namespace: KILT's HotpotQA, no --task needed
    kilt = [{"id": r["query_id"], "input": r["query"], "output": [{"answer": r["answers"][0]}]} for r in rows]
    write_jsonl(data, kilt)
    assert evaluate(capsys, *base)[0] == 0
    metrics = metrics_of(tmp_path / "o")
    assert (metrics["task"], metrics["rule"]) == ("kilt_hotpotqa", "kilt")
    assert metrics["f1"] == pytest.approx(100 * 7 / 12)


def test_a_run_split_into_parts_merges_into_the_files_of_one_process(
    toy_world, toy_dir, short_model_dir, tmp_path, capsys
):
    """Three parts and a merge write what one process writes: the same predictions to the byte with the
    stepped executor, the same metrics and table. A finished part is skipped when run again, an
    interrupted one resumes, and the merge refuses in one line while a part is missing or unfinished."""
    from corag.retrieval.bm25 import build_bm25_folder

    build_bm25_folder([toy_world.passages], tmp_path / "bm25")
    common = ["--model", short_model_dir, "--data", toy_dir / "test.jsonl", "--corpus", toy_dir / "corpus.jsonl",
              "--retriever", tmp_path / "bm25", "--limit", 7, "--methods", "greedy:L=1",
              "no_retrieval:reader_max_new_tokens=4"]  # fmt: skip
    runs = ["greedy_L1", "no_retrieval_reader_max_new_tokens4"]
    one, split = tmp_path / "one", tmp_path / "split"
    assert evaluate(capsys, *common, "--out-dir", one)[0] == 0
    parts = [*common, "--out-dir", split, "--num-shards", 3]
    for shard in (0, 2):
        assert evaluate(capsys, *parts, "--shard", shard)[0] == 0
    part1 = split / "parts" / "part-00001-of-00003"

    status, err = evaluate(capsys, *parts, "--merge")
    lines = [line for line in err.splitlines() if "part 1 of 3" in line]
    assert status == 2 and len(lines) == 1, err
    assert str(part1 / runs[0] / "predictions.jsonl") in lines[0] and "was not run" in lines[0]
    assert "2 of its 2 question(s) unanswered" in lines[0]
    assert not (split / runs[0]).exists() and not (split / "results.md").exists()  # nothing written

    # Part 1 interrupted after one answer of its first run: the merge refuses, a rerun resumes it.
    assert evaluate(capsys, *parts, "--shard", 1)[0] == 0
    cut = part1 / runs[0] / "predictions.jsonl"
    answered = cut.read_text().splitlines(keepends=True)
    assert len(answered) == 2  # questions 2 and 3 of 0-6 (the parts hold 2, 2 and 3)
    cut.write_text(answered[0] + answered[1][:20])
    (part1 / runs[0] / "metrics.json").unlink()
    status, err = evaluate(capsys, *parts, "--merge")
    assert status == 2 and "part 1 of 3 is unfinished: 1 of its 2 question(s) unanswered" in err, err
    assert evaluate(capsys, *parts, "--shard", 1)[0] == 0
    assert cut.read_text().splitlines(keepends=True) == answered

    # A finished part is skipped: nothing loads (the model named now does not exist), nothing changes.
    before = {p: p.read_bytes() for p in part1.rglob("*") if p.is_file()}
    bad = [tmp_path / "no-model" if a == short_model_dir else a for a in parts]
    status = cli_main(["evaluate", *map(str, bad), "--shard", "1"])
    out = capsys.readouterr().out
    assert status == 0 and "part 1 of 3 already finished" in out
    assert {p: p.read_bytes() for p in part1.rglob("*") if p.is_file()} == before

    assert evaluate(capsys, *parts, "--merge")[0] == 0
    for run in runs:
        merged = (split / run / "predictions.jsonl").read_bytes()
        assert merged == (one / run / "predictions.jsonl").read_bytes()
        assert [json.loads(line)["query_id"] for line in merged.splitlines()] == [
            e.id for e in toy_world.test[:7]
        ]
        ours, theirs = metrics_of(split / run), metrics_of(one / run)
        for metrics in (ours, theirs):
            del metrics["wall_seconds"], metrics["finished_at"], metrics["settings"]["out_dir"]
        assert ours == theirs
    assert (split / "results.md").read_text() == (one / "results.md").read_text()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--shard", "3", "--num-shards", "3"], "field '--shard': need 0 <= --shard < --num-shards, got 3/3"),
        (["--num-shards", "0"], "field '--num-shards': must be 1 or more, got 0"),
        (["--merge"], "field '--merge': joins every part of a run split with --num-shards N (2 or more)"),
        (["--merge", "--shard", "1", "--num-shards", "2"], "got --shard 1 --num-shards 2"),
        (["--predictions", "p.jsonl", "--num-shards", "2"], "no --shard, --num-shards or --merge"),
    ],
)
def test_bad_part_flags_are_refused_in_one_line(flags, message, toy_dir, tmp_path, capsys):
    status, err = evaluate(capsys, "--data", toy_dir / "test.jsonl", "--out-dir", tmp_path / "o", *flags)
    assert status == 2 and err.count("\n") == 1 and message in err, err
