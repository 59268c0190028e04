"""Metric parity with the official evaluation scripts, on the real benchmark answers.

The reference oracles below transcribe the official functions line by line (names kept so they can be
compared with their sources):
- HotpotQA hotpot_evaluate_v1.py (hotpotqa/hotpot): normalize_answer, f1_score, exact_match_score;
- 2WikiMultihopQA 2wikimultihop_evaluate_v1.1.py (Alab-NII/2wikimultihop): update_answer's max over
  the answer and its aliases (its normalize/f1/em are HotpotQA's);
- MuSiQue metrics/answer.py (StonyBrookNLP/musique): get_tokens, compute_exact, compute_f1;
- KILT kilt/eval_downstream.py (facebookresearch/KILT): normalize_answer, _f1_score, _exact_match_score,
  get_gold_answers; its F1/EM/normalisation are SQuAD v1.1's evaluate-v1.1.py word for word;
- the `rouge` package 1.0.x (pltrdy/rouge) that KILT calls for ROUGE-L: the sentence split of
  Rouge.get_scores and rouge_l_summary_level with its LCS helpers (words as sets, `exclusive=True`).
"""

from __future__ import annotations

import collections
import csv
import itertools
import json
import re
import string
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corag.metrics import (
    F1_RULES,
    all_found_at_k,
    answer_scores,
    cover_em,
    exact_match,
    f1,
    f1_rule,
    kilt_precision_at_k,
    kilt_recall_at_k,
    max_over_golds,
    mean_scores,
    normalize_answer,
    r_precision,
    recall_at_k,
    reciprocal_rank_fusion,
    rouge_l,
    score_answers,
    strict_accuracy,
    token_prf,
)
from corag.types import Hit

# ---------------------------------------------------------------------------------------------------
# Reference oracles: transcriptions of the official scripts (see the module docstring).


def hotpot_normalize_answer(s):
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


def hotpot_f1_score(prediction, ground_truth):
    normalized_prediction = hotpot_normalize_answer(prediction)
    normalized_ground_truth = hotpot_normalize_answer(ground_truth)

    ZERO_METRIC = (0, 0, 0)

    if (
        normalized_prediction in ["yes", "no", "noanswer"]
        and normalized_prediction != normalized_ground_truth
    ):
        return ZERO_METRIC
    if (
        normalized_ground_truth in ["yes", "no", "noanswer"]
        and normalized_prediction != normalized_ground_truth
    ):
        return ZERO_METRIC

    prediction_tokens = normalized_prediction.split()
    ground_truth_tokens = normalized_ground_truth.split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return ZERO_METRIC
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1, precision, recall


def hotpot_exact_match_score(prediction, ground_truth):
    return hotpot_normalize_answer(prediction) == hotpot_normalize_answer(ground_truth)


def twowiki_update_answer(prediction, golds):
    """2Wiki's update_answer, returning the maxima instead of adding them to a metrics dict."""
    max_em, max_f1, max_prec, max_recall = 0, 0, 0, 0
    for gold in golds:
        em = hotpot_exact_match_score(prediction, gold)
        f1, prec, recall = hotpot_f1_score(prediction, gold)
        max_em = max(max_em, em)
        max_f1 = max(max_f1, f1)
        max_prec = max(max_prec, prec)
        max_recall = max(max_recall, recall)
    return float(max_em), max_f1, max_prec, max_recall


def musique_normalize_answer(s):
    def remove_articles(text):
        regex = re.compile(r"\b(a|an|the)\b", re.UNICODE)
        return re.sub(regex, " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def musique_get_tokens(s):
    if not s:
        return []
    return musique_normalize_answer(s).split()


def musique_compute_exact(a_gold, a_pred):
    return int(musique_normalize_answer(a_gold) == musique_normalize_answer(a_pred))


def musique_compute_f1(a_gold, a_pred):
    gold_toks = musique_get_tokens(a_gold)
    pred_toks = musique_get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        # If either is no-answer, then F1 is 1 if they agree, 0 otherwise
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def musique_metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    scores_for_ground_truths = []
    for ground_truth in ground_truths:
        score = metric_fn(prediction, ground_truth)
        scores_for_ground_truths.append(score)
    return max(scores_for_ground_truths)


def kilt_normalize_answer(s):
    """KILT's normalize_answer (identical to SQuAD v1.1's)."""

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


def kilt_f1_score(prediction, ground_truth):
    """KILT's _f1_score (identical to SQuAD v1.1's f1_score)."""
    prediction_tokens = kilt_normalize_answer(prediction).split()
    ground_truth_tokens = kilt_normalize_answer(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def kilt_exact_match_score(prediction, ground_truth):
    return kilt_normalize_answer(prediction) == kilt_normalize_answer(ground_truth)


def kilt_metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    scores_for_ground_truths = []
    for ground_truth in ground_truths:
        score = metric_fn(prediction, ground_truth)
        scores_for_ground_truths.append(score)
    return max(scores_for_ground_truths)


def kilt_get_gold_answers(gold):
    ground_truths = set()
    for item in gold["output"]:
        if "answer" in item and item["answer"] and len(item["answer"].strip()) > 0:
            ground_truths.add(item["answer"].strip())
    return ground_truths


# The `rouge` package's ROUGE-L (rouge_score.py and Rouge.get_scores), with exclusive=True as forced
# for rouge-l; Ngrams(exclusive=True) is a set.
def rouge_split_into_words(sentences):
    return list(itertools.chain(*[_.split(" ") for _ in sentences]))


def rouge_lcs(x, y):
    n, m = len(x), len(y)
    table = dict()
    for i in range(n + 1):
        for j in range(m + 1):
            if i == 0 or j == 0:
                table[i, j] = 0
            elif x[i - 1] == y[j - 1]:
                table[i, j] = table[i - 1, j - 1] + 1
            else:
                table[i, j] = max(table[i - 1, j], table[i, j - 1])
    return table


def rouge_recon_lcs(x, y):
    i, j = len(x), len(y)
    table = rouge_lcs(x, y)

    def _recon(i, j):
        if i == 0 or j == 0:
            return []
        elif x[i - 1] == y[j - 1]:
            return _recon(i - 1, j - 1) + [(x[i - 1], i)]
        elif table[i - 1, j] > table[i, j - 1]:
            return _recon(i - 1, j)
        else:
            return _recon(i, j - 1)

    recon_list = list(map(lambda x: x[0], _recon(i, j)))
    return set(recon_list)


def rouge_union_lcs(evaluated_sentences, reference_sentence, prev_union=None):
    if prev_union is None:
        prev_union = set()
    if len(evaluated_sentences) <= 0:
        raise ValueError("Collections must contain at least 1 sentence.")
    lcs_union = prev_union
    prev_count = len(prev_union)
    reference_words = rouge_split_into_words([reference_sentence])
    for eval_s in evaluated_sentences:
        evaluated_words = rouge_split_into_words([eval_s])
        lcs = rouge_recon_lcs(reference_words, evaluated_words)
        lcs_union = lcs_union.union(lcs)
    new_lcs_count = len(lcs_union) - prev_count
    return new_lcs_count, lcs_union


def rouge_l_summary_level(evaluated_sentences, reference_sentences):
    if len(evaluated_sentences) <= 0 or len(reference_sentences) <= 0:
        raise ValueError("Collections must contain at least 1 sentence.")
    m = len(set(rouge_split_into_words(reference_sentences)))
    n = len(set(rouge_split_into_words(evaluated_sentences)))
    union_lcs_sum_across_all_references = 0
    union = set()
    for ref_s in reference_sentences:
        lcs_count, union = rouge_union_lcs(evaluated_sentences, ref_s, prev_union=union)
        union_lcs_sum_across_all_references += lcs_count
    llcs = union_lcs_sum_across_all_references
    r_lcs = llcs / m
    p_lcs = llcs / n
    f_lcs = 2.0 * ((p_lcs * r_lcs) / (p_lcs + r_lcs + 1e-8))
    return {"f": f_lcs, "p": p_lcs, "r": r_lcs}


def kilt_rougel_score(prediction, ground_truth):
    """KILT's _rougel_score over Rouge().get_scores(prediction, ground_truth, avg=True)["rouge-l"]["f"].

    get_scores also computes rouge-1/2 first, which raise the same "empty" ValueError on empty input.
    """
    hyp = [" ".join(_.split()) for _ in prediction.split(".") if len(_) > 0]
    ref = [" ".join(_.split()) for _ in ground_truth.split(".") if len(_) > 0]
    try:
        if len(hyp) <= 0:
            raise ValueError("Hypothesis is empty.")
        if len(ref) <= 0:
            raise ValueError("Reference is empty.")
        return rouge_l_summary_level(hyp, ref)["f"]
    except ValueError:
        return 0.0


# ---------------------------------------------------------------------------------------------------
# Real answers from the benchmark samples, and perturbed predictions.


def _bamboogle_golds(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return [[cell for cell in row[4:6] if cell] for row in csv.reader(f)]


@pytest.fixture(scope="module")
def real_golds(shared_data: Path) -> dict[str, list[list[str]]]:
    """dataset -> gold answer lists (answer first, then aliases) of every sample record."""
    hotpot = json.loads((shared_data / "hotpotqa/hotpot_dev_distractor_sample.json").read_text())
    twowiki = json.loads((shared_data / "2wikimultihopqa/2wiki_dev_sample.json").read_text())
    musique_lines = (shared_data / "musique/musique_ans_v1.0_dev_sample.jsonl").read_text().splitlines()
    musique = [json.loads(line) for line in musique_lines if line.strip()]
    kilt_lines = (shared_data / "kilt/hotpotqa-dev-kilt.sample.jsonl").read_text().splitlines()
    kilt = [json.loads(line) for line in kilt_lines if line.strip()]
    return {
        "hotpotqa": [[r["answer"]] for r in hotpot],
        "2wikimultihopqa": [[r["answer"]] for r in twowiki],
        "musique": [[r["answer"], *r["answer_aliases"]] for r in musique],
        "bamboogle": _bamboogle_golds(shared_data / "bamboogle/bamboogle.csv"),
        "kilt": [sorted(kilt_get_gold_answers(r)) for r in kilt],
    }


TRICKY = [
    "",
    " ",
    "yes",
    "Yes.",
    "no",
    "No!",
    "noanswer",
    "“Yes”",
    "The Beatles",
    "Beatles",
    "the the",
    "An apple a day",
    "Jean–Paul Sartre",
    "Jean-Paul Sartre",
    "1,000",
    "1000",
    "3.5",
    "35",
    "  spaced\tout\nanswer  ",
    "Paris. France",
    "«Paris»",
]


def perturbations(answer: str, other: str) -> list[str]:
    """Predictions near a gold answer: case, articles, punctuation, unicode, partial, wrong."""
    words = answer.split()
    return [
        answer,
        answer.upper(),
        answer.lower(),
        f"The {answer}",
        f"an {answer}.",
        f"{answer}!",
        f"“{answer}”",
        answer.replace(" ", "–"),
        answer.replace(",", ""),
        answer.replace(" ", "  \t"),
        f"  {answer}\n",
        " ".join(words[:1]),
        " ".join(words[1:]),
        f"{answer} and {answer}",
        f"I think it is {answer}",
        f"{answer}. {other}",
        other,
        f"{other} {answer}",
        *TRICKY,
    ]


def _pairs(golds: list[list[str]]) -> list[tuple[str, list[str]]]:
    """(prediction, golds) for every record's perturbations; the wrong answer is the next record's."""
    pairs = []
    for index, gold in enumerate(golds):
        other = golds[(index + 1) % len(golds)][0]
        for answer in gold:
            pairs.extend((pred, gold) for pred in perturbations(answer, other))
    return pairs


# ---------------------------------------------------------------------------------------------------
# Parity on the real answers


def test_samples_hold_what_the_parity_tests_need(real_golds):
    """The parity tests only mean something if the samples hold yes/no answers, aliases and numbers."""
    hotpot = [g[0] for g in real_golds["hotpotqa"]]
    assert "yes" in hotpot and "no" in hotpot
    assert any(len(g) > 1 for g in real_golds["musique"])
    assert any(len(g) > 1 for g in real_golds["bamboogle"])
    assert any("," in g[0] and any(c.isdigit() for c in g[0]) for g in real_golds["hotpotqa"])
    assert any(any(ord(c) > 127 for c in g[0]) for g in real_golds["2wikimultihopqa"])
    assert len(real_golds["kilt"]) == 1000


def test_hotpotqa_parity(real_golds):
    for pred, golds in _pairs(real_golds["hotpotqa"]):
        (gold,) = golds  # HotpotQA has one answer per question
        assert normalize_answer(pred) == hotpot_normalize_answer(pred)
        scores = answer_scores(pred, golds, "hotpotqa")
        f1_, prec, recall = hotpot_f1_score(pred, gold)
        assert scores["em"] == float(hotpot_exact_match_score(pred, gold)), (pred, gold)
        assert (scores["f1"], scores["precision"], scores["recall"]) == pytest.approx((f1_, prec, recall))


def test_2wiki_parity(real_golds):
    for pred, golds in _pairs(real_golds["2wikimultihopqa"]):
        scores = answer_scores(pred, golds, "2wikimultihopqa")
        expected = twowiki_update_answer(pred, golds)
        got = (scores["em"], scores["f1"], scores["precision"], scores["recall"])
        assert got == pytest.approx(expected), (pred, golds)


def test_musique_parity_with_aliases(real_golds):
    for pred, golds in _pairs(real_golds["musique"]):
        scores = answer_scores(pred, golds, "musique")
        em = musique_metric_max_over_ground_truths(lambda p, g: musique_compute_exact(g, p), pred, golds)
        f1_ = musique_metric_max_over_ground_truths(lambda p, g: musique_compute_f1(g, p), pred, golds)
        assert scores["em"] == float(em), (pred, golds)
        assert scores["f1"] == pytest.approx(f1_), (pred, golds)


@pytest.mark.parametrize("dataset", ["kilt", "bamboogle"])
def test_squad_rule_parity(real_golds, dataset):
    """KILT and Bamboogle use the SQuAD v1.1 / KILT functions (no yes/no rule, empty F1 0)."""
    for pred, golds in _pairs(real_golds[dataset]):
        scores = answer_scores(pred, golds, dataset)
        em = kilt_metric_max_over_ground_truths(kilt_exact_match_score, pred, golds)
        f1_ = kilt_metric_max_over_ground_truths(kilt_f1_score, pred, golds)
        assert scores["em"] == float(em), (pred, golds)
        assert scores["f1"] == pytest.approx(f1_), (pred, golds)


def test_rouge_l_parity_on_kilt_answers(real_golds):
    for pred, golds in _pairs(real_golds["kilt"][:300]):
        for gold in golds:
            assert rouge_l(pred, gold) == pytest.approx(kilt_rougel_score(pred, gold), abs=1e-12), (
                pred,
                gold,
            )


# ---------------------------------------------------------------------------------------------------
# Parity on generated strings

WORDS = ["a", "an", "the", "The", "A", "AN", "yes", "No", "noanswer", "Beatles", "1,000", "3.5", "x", "x"]
PIECES = [*WORDS, ".", ",", "-", "–", "—", "“", "”", "'", "’", "«", "»", "!", "(", ")", "é", "ß", "İ"]
SEPARATORS = ["", " ", "  ", "\t", "\n", ".", ". ", "-"]


@st.composite
def answer_text(draw) -> str:
    pieces = draw(st.lists(st.sampled_from(PIECES), max_size=8))
    seps = draw(st.lists(st.sampled_from(SEPARATORS), min_size=len(pieces), max_size=len(pieces)))
    return "".join(p + s for p, s in zip(pieces, seps, strict=True))


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(pred=answer_text(), gold=answer_text())
def test_generated_strings_match_every_official_rule(pred, gold):
    assert normalize_answer(pred) == hotpot_normalize_answer(pred) == musique_normalize_answer(pred)
    assert exact_match(pred, gold) == float(hotpot_exact_match_score(pred, gold))
    assert token_prf(pred, gold, rule="hotpotqa") == pytest.approx(hotpot_f1_score(pred, gold))
    assert f1(pred, gold, rule="musique") == pytest.approx(musique_compute_f1(gold, pred))
    assert f1(pred, gold) == pytest.approx(kilt_f1_score(pred, gold))
    assert rouge_l(pred, gold) == pytest.approx(kilt_rougel_score(pred, gold), abs=1e-12)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(text=st.text(max_size=30))
def test_arbitrary_unicode_normalises_like_the_official_function(text):
    assert normalize_answer(text) == hotpot_normalize_answer(text)


# ---------------------------------------------------------------------------------------------------
# The rules themselves, on named cases


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Beatles", "beatles"),
        ("“Yes”", "“yes”"),  # non-ASCII quotes are kept
        ("Jean–Paul", "jean–paul"),  # so is the en dash
        ("Jean-Paul", "jeanpaul"),  # the ASCII hyphen goes, joining the words
        ("1,000", "1000"),
        ("3.5", "35"),
        ("  a  theatre\tan\n", "theatre"),  # whole words only: "theatre" keeps its "the"
        ("the.an", "thean"),  # punctuation goes BEFORE articles, so "the.an" is one word
        ("", ""),
    ],
)
def test_normalize_answer_cases(text, expected):
    assert normalize_answer(text) == expected


def test_yes_no_rule_only_where_the_dataset_uses_it():
    # "yes it is" shares a token with "yes", but HotpotQA and 2Wiki give no partial credit
    assert f1("yes it is", "yes") == pytest.approx(0.5)
    assert f1("yes it is", "yes", rule="hotpotqa") == 0.0
    assert answer_scores("yes it is", ["yes"], "2wikimultihopqa")["f1"] == 0.0
    assert answer_scores("yes it is", ["yes"], "musique")["f1"] == pytest.approx(0.5)
    assert answer_scores("Yes.", ["yes"], "hotpotqa") == pytest.approx(
        {"em": 1.0, "f1": 1.0, "precision": 1.0, "recall": 1.0, "cover_em": 1.0}
    )


def test_empty_strings_follow_each_official_script():
    assert exact_match("", "") == 1.0
    assert f1("", "") == 0.0 and f1("", "", rule="hotpotqa") == 0.0
    assert f1("", "", rule="musique") == 1.0
    assert f1("the", "", rule="musique") == 1.0  # both normalise to nothing
    assert f1("", "Paris", rule="musique") == 0.0
    assert cover_em("anything", "the") == 0.0 and cover_em("", "the") == 1.0


def test_cover_em_and_max_over_aliases():
    assert cover_em("It was the Baltimore Orioles.", "Orioles") == 1.0
    assert cover_em("Baltimore", "Baltimore Orioles") == 0.0
    golds = ["Pittsburgh Pirates", "Orioles", "Mets"]
    assert max_over_golds(exact_match, "the Mets", golds) == 1.0
    scores = answer_scores("New York Mets", golds, "musique")
    assert scores["em"] == 0.0 and scores["f1"] == pytest.approx(0.5) and scores["cover_em"] == 1.0
    with pytest.raises(ValueError):
        answer_scores("x", [], "musique")


def test_dataset_names_pick_rules():
    assert f1_rule("hotpotqa") == f1_rule("2wikimultihopqa") == "hotpotqa"
    assert f1_rule("musique") == "musique"
    assert f1_rule("kilt_nq") == f1_rule("bamboogle") == f1_rule("toy") == "squad"
    assert set(F1_RULES.values()) == {"squad", "hotpotqa", "musique"}
    with pytest.raises(ValueError, match="unknown dataset"):
        f1_rule("nq")
    with pytest.raises(ValueError, match="unknown F1 rule"):
        f1("a", "b", rule="hotpot")


# Pairs computed by hand with Search-R1's `em_check` (verl/utils/reward_score/qa_em.py): lower, drop
# ASCII punctuation, drop a/an/the, collapse whitespace; 1 when it equals any normalised gold.
SEARCH_R1_EM_PAIRS = [
    ("Norway", ["norway"], 1.0),
    ("The  Danube.", ["Danube"], 1.0),  # article, punctuation and spacing
    ("U.S.A.", ["USA"], 1.0),  # punctuation inside a word goes: "usa"
    ("an apple", ["Apple", "pear"], 1.0),  # any gold
    ("the theatre", ["theatre"], 1.0),  # "the" only as a whole word
    ("Anne", ["ne"], 0.0),  # "an" inside a word stays
    ("Philip K. Dick", ["Philip K Dick", "Philip Kindred Dick"], 1.0),
    ("Rock–paper", ["Rock paper"], 0.0),  # the en dash is not ASCII punctuation: kept
    ("Oslo, Norway", ["Oslo"], 0.0),  # exact, not containment
    ("", ["the"], 1.0),  # both normalise to nothing
    ("no", ["yes"], 0.0),
]


@pytest.mark.parametrize(("prediction", "golds", "em"), SEARCH_R1_EM_PAIRS)
def test_search_r1_rule_is_its_em_check(prediction: str, golds: list[str], em: float) -> None:
    """Search-R1's EM uses SQuAD's normalisation in SQuAD's order and any gold, so no pair of strings
    tells it apart from the SQuAD rule's EM: each hand-computed pair scores the same under both. (The
    release differs only in reading the answer, corag.methods.search_r1; its F1 is SQuAD's, as it has
    none of its own.)"""
    scores = answer_scores(prediction, golds, "search-r1")
    assert scores["em"] == em == answer_scores(prediction, golds, "squad")["em"]
    assert scores["f1"] == answer_scores(prediction, golds, "squad")["f1"]
    assert f1_rule("search-r1") == "squad"


def test_score_answers_averages():
    result = score_answers(["Paris", "yes it is", ""], [["Paris"], ["yes"], ["Rome"]], "hotpotqa")
    assert result["count"] == 3.0
    assert result["em"] == pytest.approx(1 / 3) and result["f1"] == pytest.approx(1 / 3)
    assert mean_scores([]) == {}
    with pytest.raises(ValueError):
        score_answers(["a"], [], "hotpotqa")


# ---------------------------------------------------------------------------------------------------
# KILT metrics on hand-computed cases


@pytest.mark.parametrize(
    ("pred", "ref", "expected"),
    [
        ("the cat sat", "the cat sat", 1.0),
        # LCS of [the cat sat] and [cat the] backtracks to "cat": R = 1/3, P = 1/2, F = 0.4
        ("cat the", "the cat sat", 0.4),
        ("Barack Obama", "Obama", 2 / 3),  # R = 1, P = 1/2
        ("a a a", "a", 1.0),  # words count as a set, so repeats cost nothing
        ("Paris. France", "Paris France", 1.0),  # per-sentence LCSs are united
        # [b a] vs [a b] has two LCSs of length 1; the package's backtrack keeps "b", which the
        # second sentence repeats, so the union holds one word of two: F = 0.5
        ("b a. b", "a b", 0.5),
        ("paris", "Paris", 0.0),  # no normalisation: case matters
        ("", "Paris", 0.0),
        ("...", "Paris", 0.0),  # nothing but sentence breaks
        ("Paris", "", 0.0),
    ],
)
def test_rouge_l_hand_cases(pred, ref, expected):
    assert rouge_l(pred, ref) == pytest.approx(expected, abs=1e-7)


def test_strict_accuracy_is_not_normalised():
    assert strict_accuracy(" SUPPORTS ", ["SUPPORTS", "REFUTES"]) == 1.0
    assert strict_accuracy("supports", ["SUPPORTS"]) == 0.0
    assert strict_accuracy("The Beatles", ["Beatles"]) == 0.0


def test_kilt_r_precision_and_recall_hand_cases():
    # one evidence set {1, 2}: the first R=2 guesses are 2, 3 -> R-precision 1/2;
    # the set completes at the third guess, which is the second rank point (2 and 1 share one point)
    gold = [["1", "2"]]
    assert r_precision(["2", "3", "1"], gold) == 0.5
    assert kilt_recall_at_k(["2", "3", "1"], gold, 1) == 0.0
    assert kilt_recall_at_k(["2", "3", "1"], gold, 2) == 1.0
    assert kilt_precision_at_k(["2", "3", "1"], gold, 2) == 0.5
    # two evidence sets; R-precision is the best over them
    gold = [["1"], ["2", "3"]]
    assert r_precision(["2", "1", "3"], gold) == 0.5
    assert r_precision(["1"], gold) == 1.0
    assert kilt_recall_at_k(["2", "1", "3"], gold, 1) == 0.5
    assert kilt_recall_at_k(["2", "1", "3"], gold, 2) == 1.0
    # repeated and padded guesses count once; no guesses or no gold give 0
    assert r_precision([" 2", "2", "1 "], [["1", "2"]]) == 1.0
    assert r_precision([], gold) == 0.0 and r_precision(["1"], []) == 0.0
    assert kilt_recall_at_k([], gold, 5) == 0.0
    with pytest.raises(ValueError):
        kilt_recall_at_k(["1"], gold, 0)


# ---------------------------------------------------------------------------------------------------
# Retrieval


def test_recall_at_k_hand_cases():
    ranked = ["d3", "d1", "d9", "d2", "d1"]
    assert recall_at_k(ranked, {"d1", "d2"}, 1) == 0.0
    assert recall_at_k(ranked, {"d1", "d2"}, 2) == 0.5
    assert recall_at_k(ranked, ["d1", "d2", "d2"], 4) == 1.0  # gold ids count once
    assert recall_at_k(ranked, {"d1", "d7"}, 100) == 0.5
    assert all_found_at_k(ranked, {"d1", "d2"}, 3) == 0.0
    assert all_found_at_k(ranked, {"d1", "d2"}, 4) == 1.0
    with pytest.raises(ValueError):
        recall_at_k(ranked, set(), 3)


def test_reciprocal_rank_fusion_hand_case():
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["b", "c", "d"]], k0=1)
    # a: 1/2; b: 1/3 + 1/2; c: 1/4 + 1/3; d: 1/4
    assert [h.doc_id for h in fused] == ["b", "c", "a", "d"]
    assert [h.score for h in fused] == pytest.approx([5 / 6, 7 / 12, 1 / 2, 1 / 4])


def test_reciprocal_rank_fusion_ties_and_hits():
    # x and y tie exactly; x appears first. A repeat inside one list counts once, at its best rank.
    fused = reciprocal_rank_fusion([[Hit("x", 9.0), Hit("y", 1.0), Hit("x", 0.5)], ["y", "x"]])
    assert [h.doc_id for h in fused] == ["x", "y"]
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 62)
    assert fused[0].score == fused[1].score
    reordered = reciprocal_rank_fusion([["y", "x"], ["x", "y"]])
    assert [h.doc_id for h in reordered] == ["y", "x"]
    assert reciprocal_rank_fusion([]) == []
