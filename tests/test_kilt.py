"""KILT submissions: writing, validation, and score parity with KILT's own evaluation code.

The oracle below transcribes kilt/eval_downstream.py (_calculate_metrics and its helpers) and
kilt/eval_retrieval.py (get_rank, rprecision and the precision/recall points) from
facebookresearch/KILT. Its ROUGE-L is corag.metrics.rouge_l, which tests/test_metrics.py checks
against a transcription of the `rouge` package that KILT calls.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from corag.cli import main as cli_main
from corag.data.jsonl import iter_jsonl as read_jsonl
from corag.errors import InputError
from corag.kilt import (
    KiltPrediction,
    load_gold,
    score_pairs,
    score_submission,
    submission_record,
    validate_submission,
    write_submission,
)
from corag.metrics import rouge_l

# ---------------------------------------------------------------------------------------------------
# Oracle: KILT's evaluation code, transcribed.


def normalize_answer(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def _f1_score(prediction, ground_truth):
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def _exact_match_score(prediction, ground_truth):
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def _metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    scores_for_ground_truths = []
    for ground_truth in ground_truths:
        score = metric_fn(prediction, ground_truth)
        scores_for_ground_truths.append(score)
    return max(scores_for_ground_truths)


def get_gold_answers(gold):
    ground_truths = set()
    for item in gold["output"]:
        if "answer" in item and item["answer"] and len(item["answer"].strip()) > 0:
            ground_truths.add(item["answer"].strip())
    return ground_truths


def _remove_duplicates(obj):
    obj_tmp = []
    for o in obj:
        if o not in obj_tmp:
            obj_tmp.append(o)
    return obj_tmp


def _get_ids_list(datapoint, rank_keys):
    ids_list = []
    for output in datapoint["output"]:
        current_ids_list = []
        if "provenance" in output:
            for provenance in output["provenance"]:
                if any(rank_key not in provenance for rank_key in rank_keys):
                    pass
                else:
                    current_ids_list.append(
                        "+".join([str(provenance[rank_key]).strip() for rank_key in rank_keys])
                    )
        ids_list.append(_remove_duplicates(current_ids_list))
    return ids_list


def get_rank(guess_item, gold_item, k, rank_keys):
    assert k > 0, "k must be a positive integer grater than 0."
    rank = []
    num_distinct_evidence_sets = 0
    guess_ids = _get_ids_list(guess_item, rank_keys)[0]
    if guess_ids and len(guess_ids) > 0:
        evidence_sets = []
        e_size = defaultdict(int)
        for output in gold_item["output"]:
            if "provenance" in output:
                e_set = {
                    "+".join(
                        [
                            str(provenance[rank_key]).strip()
                            for rank_key in rank_keys
                            if rank_key in provenance
                        ]
                    )
                    for provenance in output["provenance"]
                }
                if e_set not in evidence_sets:
                    evidence_sets.append(e_set)
                    e_size[len(e_set)] += 1
        num_distinct_evidence_sets = len(evidence_sets)
        rank = []
        for guess_id in guess_ids:
            guess_id = str(guess_id).strip()
            found = False
            for idx, e_set in enumerate(evidence_sets):
                e_set_id = f"evidence_set:{idx}"
                if guess_id in e_set:
                    found = True
                    if e_set_id in rank:
                        rank.remove(e_set_id)
                    e_set.remove(guess_id)
                    if len(e_set) == 0:
                        rank.append(True)
                    else:
                        rank.append(e_set_id)
            if not found:
                rank.append(False)
    return rank, num_distinct_evidence_sets


def _precision_at_k(rank, k):
    p = rank[:k].count(True) / k
    return p


def _recall_at_k(rank, num_distinct_evidence_sets, k):
    r = rank[:k].count(True) / num_distinct_evidence_sets
    return r


def _computeRprec(guess_ids, gold_ids):
    R = len(gold_ids)
    num = 0
    for prediction in guess_ids[:R]:
        if str(prediction).strip() in gold_ids:
            num += 1
    Rprec = num / R if R > 0 else 0
    return Rprec


def rprecision(guess_item, gold_item, rank_keys):
    gold_ids_list = _get_ids_list(gold_item, rank_keys)
    guess_ids = _get_ids_list(guess_item, rank_keys)[0]
    Rprec_vector = []
    for gold_ids in gold_ids_list:
        Rprec = _computeRprec(guess_ids, gold_ids)
        Rprec_vector.append(Rprec)
    return max(Rprec_vector)


def oracle_retrieval(gold_records, guess_records, ks):
    """eval_retrieval.compute: mean Rprec, precision@k (k > 0) and recall@k (k > 1)."""
    result = {"Rprec": 0.0}
    for k in ks:
        result[f"precision@{k}"] = 0.0
        if k > 1:
            result[f"recall@{k}"] = 0.0
    for guess_item, gold_item in zip(guess_records, gold_records, strict=True):
        result["Rprec"] += rprecision(guess_item, gold_item, rank_keys=["wikipedia_id"])
        for k in ks:
            rank, num_distinct_evidence_sets = get_rank(guess_item, gold_item, k, rank_keys=["wikipedia_id"])
            if num_distinct_evidence_sets > 0:
                result[f"precision@{k}"] += _precision_at_k(rank, k)
                if k > 1:
                    result[f"recall@{k}"] += _recall_at_k(rank, num_distinct_evidence_sets, k)
    return {key: value / len(guess_records) for key, value in result.items()}


def oracle_calculate_metrics(gold_records, guess_records):
    """eval_downstream._calculate_metrics, with `_rougel_score` as corag.metrics.rouge_l."""
    total_count = 0
    accuracy = normalized_em = normalized_f1 = rougel = 0
    kilt_accuracy = kilt_em = kilt_f1 = kilt_rougel = 0
    for guess_item, gold_item in zip(guess_records, gold_records, strict=True):
        assert str(gold_item["id"]).strip() == str(guess_item["id"]).strip()
        total_count += 1
        gold_candidate_answers = get_gold_answers(gold_item)
        guess_answer = str(guess_item["output"][0]["answer"]).strip()
        if len(guess_answer) == 0:
            continue
        local_accuracy = 0
        if guess_answer in gold_candidate_answers:
            local_accuracy = 1
        accuracy += local_accuracy
        local_em = _metric_max_over_ground_truths(_exact_match_score, guess_answer, gold_candidate_answers)
        normalized_em += local_em
        local_f1 = _metric_max_over_ground_truths(_f1_score, guess_answer, gold_candidate_answers)
        normalized_f1 += local_f1
        local_rougel = _metric_max_over_ground_truths(rouge_l, guess_answer, gold_candidate_answers)
        rougel += local_rougel
        Rprec = rprecision(guess_item, gold_item, rank_keys=["wikipedia_id"])
        if Rprec == 1:
            kilt_accuracy += local_accuracy
            kilt_em += local_em
            kilt_f1 += local_f1
            kilt_rougel += local_rougel
    n = total_count
    return {
        "kilt": {
            "KILT-accuracy": kilt_accuracy / n,
            "KILT-em": kilt_em / n,
            "KILT-f1": kilt_f1 / n,
            "KILT-rougel": kilt_rougel / n,
        },
        "downstream": {
            "accuracy": accuracy / n,
            "em": normalized_em / n,
            "f1": normalized_f1 / n,
            "rougel": rougel / n,
        },
    }


# ---------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def gold_path(shared_data: Path) -> Path:
    return shared_data / "kilt" / "hotpotqa-dev-kilt.sample.jsonl"


@pytest.fixture(scope="module")
def gold_records(gold_path: Path) -> list[dict]:
    return [obj for _, obj in read_jsonl(gold_path)]


def _gold_pages(record: dict) -> list[str]:
    return [p["wikipedia_id"] for p in record["output"][0]["provenance"]]


def _noisy_predictions(gold_records: list[dict], seed: int = 0) -> list[KiltPrediction]:
    """Answers and pages near the gold ones: exact, reworded, wrong, empty; pages reordered, cut, padded."""
    rng = random.Random(seed)
    all_pages = sorted({page for r in gold_records for page in _gold_pages(r)})
    preds = []
    for index, record in enumerate(gold_records):
        answer = record["output"][0]["answer"]
        other = gold_records[(index + 1) % len(gold_records)]["output"][0]["answer"]
        answer = rng.choice(
            [
                answer,
                answer,
                answer.upper(),
                f"The {answer}.",
                f"{answer} and {other}",
                other,
                "",
                "  ",
                "yes",
            ]
        )
        pages = list(dict.fromkeys(_gold_pages(record)))
        pages = rng.choice(
            [
                pages,
                pages[::-1],
                pages[:1],
                [rng.choice(all_pages), *pages],
                [*pages, rng.choice(all_pages)],
                [pages[-1], rng.choice(all_pages), pages[0]],
                [],
            ]
        )
        preds.append(KiltPrediction(record["id"], answer, tuple(pages)))
    return preds


# ---------------------------------------------------------------------------------------------------
# Writing


def test_write_submission_lines_and_atomicity(tmp_path):
    path = tmp_path / "out" / "sub.jsonl"
    preds = [KiltPrediction("q1", "Paris", ("12", "12", "7")), KiltPrediction("q2", "“Yes”")]
    assert write_submission(path, preds) == 2
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {
            "id": "q1",
            "output": [{"answer": "Paris", "provenance": [{"wikipedia_id": "12"}, {"wikipedia_id": "7"}]}],
        },
        {"id": "q2", "output": [{"answer": "“Yes”", "provenance": []}]},
    ]
    assert sorted(p.name for p in path.parent.iterdir()) == ["sub.jsonl"]

    before = path.read_bytes()
    bad = [KiltPrediction("q1", "a"), KiltPrediction("q1", "b")]
    with pytest.raises(InputError, match="duplicate id") as err:
        write_submission(path, bad)
    assert err.value.record == "q1" and err.value.field == "id"
    assert path.read_bytes() == before  # nothing half-written
    with pytest.raises(InputError) as err:
        write_submission(path, [KiltPrediction("q3", 42)])  # type: ignore[arg-type]
    assert err.value.field == "answer"


def test_perfect_submission_scores_one(tmp_path, gold_path, gold_records):
    preds = [KiltPrediction(r["id"], r["output"][0]["answer"], tuple(_gold_pages(r))) for r in gold_records]
    sub = tmp_path / "perfect.jsonl"
    write_submission(sub, preds)
    result = score_submission(sub, gold_path, ks=(1, 5))
    assert result["count"] == len(gold_records) == 1000
    for group in ("downstream", "kilt"):
        for name, value in result[group].items():
            assert value == pytest.approx(1.0, abs=1e-7), name
    assert result["retrieval"]["Rprec"] == 1.0
    assert result["retrieval"]["recall@1"] == result["retrieval"]["recall@5"] == 1.0


# ---------------------------------------------------------------------------------------------------
# Parity with KILT's scorer


@pytest.mark.parametrize("seed", [0, 1])
def test_scores_match_kilt_evaluation(tmp_path, gold_path, gold_records, seed):
    preds = _noisy_predictions(gold_records, seed)
    sub = tmp_path / f"noisy{seed}.jsonl"
    write_submission(sub, reversed(preds))  # order must not matter
    result = score_submission(sub, gold_path, ks=(1, 5))

    guess_records = [submission_record(p) for p in preds]
    expected = oracle_calculate_metrics(gold_records, guess_records)
    retrieval = oracle_retrieval(gold_records, guess_records, ks=[1, 5])
    assert result["downstream"] == pytest.approx(expected["downstream"])
    assert result["kilt"] == pytest.approx(expected["kilt"])
    for key, value in retrieval.items():
        assert result["retrieval"][key] == pytest.approx(value), key
    # the noise must leave room on both sides, or the comparison proves little
    assert (
        0.2 < result["downstream"]["em"] < 0.8 and 0 < result["kilt"]["KILT-em"] < result["downstream"]["em"]
    )
    assert (
        0.2 < result["retrieval"]["Rprec"] < 0.9
        and result["retrieval"]["recall@1"] < result["retrieval"]["recall@5"]
    )


def test_multiple_gold_outputs_and_pages(tmp_path):
    """Several gold outputs (answers with their own evidence sets), as in KILT's NQ or FEVER files."""
    gold = [
        {
            "id": 1,
            "input": "q",
            "output": [
                {"answer": "SUPPORTS", "provenance": [{"wikipedia_id": "10"}, {"wikipedia_id": "11"}]},
                {"answer": "Supports", "provenance": [{"wikipedia_id": "12"}]},
                {"provenance": [{"wikipedia_id": "12"}]},
            ],
        },
        {
            "id": 2,
            "input": "q",
            "output": [{"answer": "  No  ", "provenance": [{"wikipedia_id": "20"}]}, {"answer": "no"}],
        },
    ]
    guess = [
        {
            "id": "1",
            "output": [{"answer": "supports", "provenance": [{"wikipedia_id": 12}, {"wikipedia_id": "10"}]}],
        },
        {"id": "2", "output": [{"answer": "No", "provenance": [{"wikipedia_id": "21"}]}]},
    ]
    gold_file, guess_file = tmp_path / "gold.jsonl", tmp_path / "guess.jsonl"
    gold_file.write_text("".join(json.dumps(r) + "\n" for r in gold))
    guess_file.write_text("".join(json.dumps(r) + "\n" for r in guess))
    result = score_submission(guess_file, gold_file, ks=(1, 2))
    expected = oracle_calculate_metrics(gold, guess)
    assert result["downstream"] == pytest.approx(expected["downstream"])
    assert result["kilt"] == pytest.approx(expected["kilt"])
    for key, value in oracle_retrieval(gold, guess, ks=[1, 2]).items():
        assert result["retrieval"][key] == pytest.approx(value), key
    # by hand: record 1 is not strictly accurate ("supports" != "SUPPORTS"/"Supports") but is an EM,
    # and its first page completes the one-page evidence set {12}; record 2 is strictly accurate
    # ("No" after stripping) but cites the wrong page
    assert result["downstream"]["accuracy"] == 0.5 and result["downstream"]["em"] == 1.0
    assert result["kilt"]["KILT-em"] == 0.5 and result["kilt"]["KILT-accuracy"] == 0.0
    assert result["retrieval"]["Rprec"] == 0.5 and result["retrieval"]["recall@1"] == 0.25


# ---------------------------------------------------------------------------------------------------
# Validation


def _write_lines(path: Path, lines: list[str]) -> Path:
    """Write lines as UTF-8, except that "\xff" stands for a byte that is not UTF-8."""
    text = "".join(line + "\n" for line in lines)
    path.write_bytes(text.encode("utf-8").replace(b"\xc3\xbf", b"\xff"))  # "\xff" in UTF-8 -> a bare byte
    return path


@pytest.fixture()
def small_gold(tmp_path, gold_records) -> Path:
    return _write_lines(tmp_path / "gold.jsonl", [json.dumps(r) for r in gold_records[:3]])


def _good_lines(gold_records: list[dict]) -> list[str]:
    return [json.dumps(submission_record(KiltPrediction(r["id"], "x", ("1",)))) for r in gold_records[:3]]


def test_valid_submission_aligns_to_gold_order(tmp_path, small_gold, gold_records):
    lines = _good_lines(gold_records)
    sub = _write_lines(tmp_path / "sub.jsonl", [lines[2], "", lines[0], lines[1]])
    pairs = validate_submission(sub, small_gold)
    assert [gold["id"] for gold, _ in pairs] == [guess["id"] for _, guess in pairs]
    assert [gold["id"] for gold, _ in pairs] == [r["id"] for r in gold_records[:3]]
    assert list(load_gold(small_gold)) == [r["id"] for r in gold_records[:3]]


@pytest.mark.parametrize(
    ("edit", "line", "field", "message"),
    [
        (lambda lines, ids: lines[:1] + ["{not json"] + lines[1:], 2, None, "not valid JSON"),
        (lambda lines, ids: lines[:1] + ["[1, 2]"] + lines[1:], 2, None, "JSON object"),
        (lambda lines, ids: lines[:2] + ['{"id": "\xff"}'] + lines[2:], 3, None, "UTF-8"),
        (lambda lines, ids: lines + [lines[1]], 4, "id", "duplicate id"),
        (lambda lines, ids: lines + [json.dumps({"output": []})], 4, "id", "invalid id"),
        (lambda lines, ids: [_sub(ids[0], answer=7), *lines[1:]], 1, "answer", "string"),
        (
            lambda lines, ids: [json.dumps({"id": ids[0], "output": [{"provenance": []}]}), *lines[1:]],
            1,
            "answer",
            "no answer",
        ),
        (
            lambda lines, ids: [json.dumps({"id": ids[0], "output": {"answer": "x"}}), *lines[1:]],
            1,
            "output",
            "list",
        ),
        (
            lambda lines, ids: [json.dumps({"id": ids[0], "output": [{"answer": "x"}] * 2}), *lines[1:]],
            1,
            "output",
            "exactly one",
        ),
        (
            lambda lines, ids: [_sub(ids[0], provenance=[{"title": "T"}]), *lines[1:]],
            1,
            "wikipedia_id",
            "wikipedia_id",
        ),
        (lambda lines, ids: [_sub(ids[0], provenance="12"), *lines[1:]], 1, "provenance", "list"),
    ],
)
def test_bad_lines_name_line_and_field(tmp_path, small_gold, gold_records, edit, line, field, message):
    ids = [r["id"] for r in gold_records[:3]]
    sub = _write_lines(tmp_path / "sub.jsonl", edit(_good_lines(gold_records), ids))
    with pytest.raises(InputError, match=message) as err:
        validate_submission(sub, small_gold)
    assert err.value.file == str(sub) and err.value.line == line and err.value.field == field
    assert f"line {line}" in str(err.value)


def _sub(record_id: str, answer: object = "x", provenance: object = None) -> str:
    """One submission line, with any field allowed to be wrong."""
    output = {"answer": answer, "provenance": [] if provenance is None else provenance}
    return json.dumps({"id": record_id, "output": [output]})


def test_missing_and_extra_ids(tmp_path, small_gold, gold_records):
    lines = _good_lines(gold_records)
    missing = gold_records[1]["id"]
    sub = _write_lines(tmp_path / "sub.jsonl", [lines[0], lines[2]])
    with pytest.raises(InputError, match="no prediction for 1 gold id") as err:
        validate_submission(sub, small_gold)
    assert err.value.record == missing and err.value.field == "id"

    sub = _write_lines(tmp_path / "sub.jsonl", [*lines, _sub("not-in-gold")])
    with pytest.raises(InputError, match="not in the gold file") as err:
        validate_submission(sub, small_gold)
    assert err.value.record == "not-in-gold"
    assert len(validate_submission(sub, small_gold, allow_extra=True)) == 3


def test_gold_without_answers_is_an_error(tmp_path):
    gold = _write_lines(tmp_path / "gold.jsonl", [json.dumps({"id": "a", "output": [{"answer": " "}]})])
    sub = _write_lines(tmp_path / "sub.jsonl", [_sub("a")])
    with pytest.raises(InputError, match="no answer") as err:
        score_submission(sub, gold)
    assert err.value.record == "a"
    assert score_pairs([]) == {
        "downstream": {"accuracy": 0.0, "em": 0.0, "f1": 0.0, "rougel": 0.0},
        "kilt": {"KILT-accuracy": 0.0, "KILT-em": 0.0, "KILT-f1": 0.0, "KILT-rougel": 0.0},
        "retrieval": {"Rprec": 0.0, "recall@1": 0.0, "precision@1": 0.0, "recall@5": 0.0, "precision@5": 0.0},
        "count": 0,
    }


def test_main_prints_scores_and_reports_errors(tmp_path, small_gold, gold_records, capsys):
    sub = _write_lines(tmp_path / "sub.jsonl", _good_lines(gold_records))
    assert cli_main(["kilt-score", str(sub), str(small_gold), "--ks", "1,2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["count"] == 3 and "recall@2" in result["retrieval"]
    partial = _write_lines(tmp_path / "partial.jsonl", _good_lines(gold_records)[:2])
    assert cli_main(["kilt-score", str(partial), str(small_gold)]) == 0
    captured = capsys.readouterr()
    assert "no prediction for 1 of 3 question(s)" in captured.err and "counts 0" in captured.err
    counted = json.loads(captured.out)
    # the missing id counts 0: the same scores as an empty answer without provenance on that line
    empty = json.loads(_good_lines(gold_records)[2])
    empty["output"] = [{"answer": "", "provenance": []}]
    padded = _write_lines(tmp_path / "padded.jsonl", [*_good_lines(gold_records)[:2], json.dumps(empty)])
    assert counted == score_submission(padded, small_gold)
    assert counted["count"] == 3
    assert cli_main(["kilt-score", str(partial), str(small_gold), "--require-all"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("corag kilt-score: error: ") and "no prediction for 1 gold id(s)" in err
    assert err.count("\n") == 1
    assert cli_main(["kilt-score", str(partial), str(small_gold), "--ks", "1,five"]) == 2
    assert "field '--ks': expected comma-separated integers" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# Page ids of retrieved passages: the map from the knowledge source


def knowledge_source(path: Path, pages: list[tuple[str, str]]) -> Path:
    """A tiny `kilt_knowledgesource.json`: one page a line, keys in the published order."""
    lines = [
        json.dumps({"_id": pid, "wikipedia_id": pid, "wikipedia_title": title,
                    "text": [f"{title}\n", f"{title} is a page."], "anchors": [], "categories": ""})
        for pid, title in pages
    ]  # fmt: skip
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_kilt_pages_maps_titles_to_page_ids(tmp_path, capsys):
    from corag.kilt import passage_pages, read_page_ids
    from corag.types import Passage

    source = knowledge_source(tmp_path / "ks.json", [("2816539", "Scott Derrickson"), ("10520", "Ed Wood")])
    with source.open("a", encoding="utf-8") as f:  # another key order, and a title seen twice
        f.write(
            json.dumps({"text": ["Ed Wood\n"], "wikipedia_title": "Ed Wood (film)", "wikipedia_id": 1234})
            + "\n"
        )
        f.write(
            json.dumps({"_id": "9", "wikipedia_id": "9", "wikipedia_title": "Ed Wood", "text": []}) + "\n"
        )
    assert cli_main(["kilt-pages", str(source), "--out", str(tmp_path / "pages.json")]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0]) == {"pages": 3, "duplicate_titles": 1}
    title_ids = read_page_ids(tmp_path / "pages.json")
    assert title_ids == {"Scott Derrickson": "2816539", "Ed Wood": "10520", "Ed Wood (film)": "1234"}
    passages = [Passage("7", "Ed Wood", "x"), Passage("3", "Unknown", "y"), Passage("8", "Ed Wood", "z"),
                Passage("1", "Scott Derrickson", "w")]  # fmt: skip
    assert passage_pages(passages, title_ids) == (["10520", "2816539"], 1)


EXPECTED = ("expected KILT's kilt_knowledgesource.json, one JSON page a line with wikipedia_id and "
            "wikipedia_title, from http://dl.fbaipublicfiles.com/KILT/kilt_knowledgesource.json")  # fmt: skip
NOT_A_PAGE = "not a knowledge-source page: the first record"
WRONG_SOURCES = {  # file name -> (its text, or None for no file; what the one line says after the path)
    "missing.json": (None, f": no such file; {EXPECTED}"),
    "empty.json": ("", f": empty file: no records; {EXPECTED}"),
    "corpus.jsonl": ('{"id": "0", "title": "Ed Wood", "contents": "Ed Wood is a film."}\n',
                     f", line 1, field 'wikipedia_id': {NOT_A_PAGE} lacks wikipedia_id and wikipedia_title "
                     f"(its keys: id, title, contents); {EXPECTED}"),
    "nq-dev-kilt.jsonl": ('{"id": "q1", "input": "who?", "output": [{"answer": "x"}]}\n',
                          f", line 1, field 'wikipedia_id': {NOT_A_PAGE} lacks wikipedia_id and "
                          f"wikipedia_title (its keys: id, input, output); {EXPECTED}"),
    "no-title.json": ('\n{"wikipedia_id": "1", "text": []}\n',
                      f", line 2, field 'wikipedia_title': {NOT_A_PAGE} lacks wikipedia_title "
                      f"(its keys: wikipedia_id, text); {EXPECTED}"),
    "array.json": ('[\n  {"wikipedia_id": "1", "wikipedia_title": "A"}\n]\n',
                   f", line 1: {NOT_A_PAGE} is not a JSON object; {EXPECTED}"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(WRONG_SOURCES))
def test_kilt_pages_refuses_a_missing_or_wrong_knowledge_source_in_one_line(name, tmp_path, capsys):
    text, said = WRONG_SOURCES[name]
    source = tmp_path / name
    if text is not None:
        source.write_text(text, encoding="utf-8")
    out = tmp_path / "pages.json"
    assert cli_main(["kilt-pages", str(source), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"corag kilt-pages: error: {source}{said}\n"  # one line, before any progress bar
    assert not out.exists()


def test_a_knowledge_source_that_is_a_folder_is_refused_naming_it(tmp_path, capsys):
    from corag.kilt import knowledge_source_file

    with pytest.raises(InputError) as err:
        knowledge_source_file(tmp_path)
    assert str(err.value) == f"{tmp_path}: is a folder, not a file; {EXPECTED}"
    good = knowledge_source(tmp_path / "ks.json", [("10520", "Ed Wood")])
    assert knowledge_source_file(good) == good


def test_bad_page_maps_and_knowledge_sources_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "ks.json").write_text('{"wikipedia_id": "1", "wikipedia_title": "A", "text": []}\nnot json\n')
    assert cli_main(["kilt-pages", str(tmp_path / "ks.json"), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the progress bar
    assert err == (f"corag kilt-pages: error: {tmp_path / 'ks.json'}, line 2, field 'wikipedia_title': "
                   "not a knowledge-source page (JSON with wikipedia_id and wikipedia_title)")  # fmt: skip
    assert not (tmp_path / "p.json").exists()  # nothing half-written
    from corag.kilt import read_page_ids

    (tmp_path / "pages.json").write_text('["Ed Wood", "10520"]')
    with pytest.raises(InputError, match="expected a JSON object of title -> page id, got list"):
        read_page_ids(tmp_path / "pages.json")
    (tmp_path / "pages.json").write_text('{"Ed Wood": ["10520"]}')
    with pytest.raises(InputError, match="expected a page id") as err:
        read_page_ids(tmp_path / "pages.json")
    assert (err.value.record, err.value.field) == ("Ed Wood", "wikipedia_id")
