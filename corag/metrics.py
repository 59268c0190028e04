"""Answer and retrieval metrics, matching the official evaluation scripts of each benchmark.

Answer metrics share the SQuAD normalisation (lowercase, drop ASCII punctuation, drop the words
a/an/the, collapse whitespace; non-ASCII punctuation such as "–" or "“" is kept). They differ only in
F1's edge cases, which `F1_RULES` names per dataset:

- "squad": SQuAD v1.1, KILT (`_f1_score`) and CoRAG's own evaluation (T5's SQuAD metrics, used for
  every multi-hop dataset in the CoRAG paper): F1 is 0 when no token is shared, so an empty prediction
  against an empty gold scores F1 0 (and EM 1).
- "hotpotqa": HotpotQA's hotpot_evaluate_v1.py and 2WikiMultihopQA's evaluate script: as "squad", but
  F1 (precision, recall) is 0 when either side normalises to "yes", "no" or "noanswer" and the two
  sides differ.
- "musique": MuSiQue's metrics/answer.py (SQuAD v2 style): when either side has no tokens, F1 is 1 if
  both are empty and 0 otherwise.
- "search-r1": Search-R1's evaluation (PeterGriffinJin/Search-R1, verl/utils/reward_score/qa_em.py:
  `em_check` over `normalize_answer`), which reports EM only: its normalisation is SQuAD's, applied in
  the same order, and it takes any gold answer, so its EM is the EM below; F1 is SQuAD's.

EM is the same everywhere: normalised strings equal (so two empty strings match). Every answer metric
takes the max over the gold answer and its aliases.

KILT metrics follow kilt/eval_downstream.py and kilt/eval_retrieval.py: strict accuracy (stripped
strings equal, no normalisation), EM, F1, ROUGE-L as the `rouge` package computes it, page-level
R-precision and recall@k over evidence sets; kilt.py turns them into per-task scores.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from fractions import Fraction

from corag.types import Hit

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL_ANSWERS = ("yes", "no", "noanswer")

# dataset name -> F1 rule (see the module docstring); any name starting with "kilt" uses "squad".
F1_RULES: dict[str, str] = {
    "squad": "squad",
    "hotpotqa": "hotpotqa",
    "2wikimultihopqa": "hotpotqa",
    "musique": "musique",
    "bamboogle": "squad",
    "multihopqa": "squad",
    "kilt": "squad",
    "toy": "squad",
    "search-r1": "squad",
}


def normalize_answer(text: str) -> str:
    """The SQuAD normalisation, in the official order: lower, punctuation, articles, whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_prf(prediction: str, gold: str, *, rule: str = "squad") -> tuple[float, float, float]:
    """Token-multiset (F1, precision, recall) of the normalised strings under an F1 rule."""
    if rule not in ("squad", "hotpotqa", "musique"):
        raise ValueError(f"unknown F1 rule {rule!r}; expected squad, hotpotqa or musique")
    pred_norm, gold_norm = normalize_answer(prediction), normalize_answer(gold)
    if rule == "hotpotqa" and pred_norm != gold_norm:
        if pred_norm in _SPECIAL_ANSWERS or gold_norm in _SPECIAL_ANSWERS:
            return 0.0, 0.0, 0.0
    pred_tokens, gold_tokens = pred_norm.split(), gold_norm.split()
    if rule == "musique" and (not pred_tokens or not gold_tokens):
        same = float(pred_tokens == gold_tokens)
        return same, same, same
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0, 0.0, 0.0
    precision, recall = num_same / len(pred_tokens), num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def f1(prediction: str, gold: str, *, rule: str = "squad") -> float:
    """Token F1 of the normalised strings under an F1 rule ("squad", "hotpotqa" or "musique")."""
    return token_prf(prediction, gold, rule=rule)[0]


def cover_em(prediction: str, gold: str) -> float:
    """1.0 when the normalised gold is a substring of the normalised prediction (character level).

    A gold that normalises to nothing counts only against an empty prediction (as EM would), so that
    an answer like "the" cannot match every prediction.
    """
    gold_norm, pred_norm = normalize_answer(gold), normalize_answer(prediction)
    if not gold_norm:
        return float(not pred_norm)
    return float(gold_norm in pred_norm)


def max_over_golds(metric: Callable[[str, str], float], prediction: str, golds: Sequence[str]) -> float:
    """The best score of `prediction` against any gold answer or alias (as every official script does)."""
    if not golds:
        raise ValueError("no gold answers to score against")
    return max(metric(prediction, gold) for gold in golds)


def f1_rule(dataset: str) -> str:
    """The F1 rule of a dataset name (see `F1_RULES`); KILT task names start with "kilt"."""
    if dataset in F1_RULES:
        return F1_RULES[dataset]
    if dataset.startswith("kilt"):
        return "squad"
    raise ValueError(f"unknown dataset {dataset!r}; known: {', '.join(F1_RULES)} and kilt*")


def answer_scores(prediction: str, golds: Sequence[str], dataset: str = "squad") -> dict[str, float]:
    """EM, F1, precision, recall and cover-EM of one prediction, each maxed over the golds separately.

    Taking each maximum separately is what the 2WikiMultihopQA script does for precision and recall;
    for EM and F1 every official script agrees.
    """
    if not golds:
        raise ValueError("no gold answers to score against")
    rule = f1_rule(dataset)
    prfs = [token_prf(prediction, gold, rule=rule) for gold in golds]
    return {
        "em": max_over_golds(exact_match, prediction, golds),
        "f1": max(p[0] for p in prfs),
        "precision": max(p[1] for p in prfs),
        "recall": max(p[2] for p in prfs),
        "cover_em": max_over_golds(cover_em, prediction, golds),
    }


def mean_scores(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Average each metric over rows that all have the same keys; an empty input gives {}."""
    if not rows:
        return {}
    return {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]}


def score_answers(
    predictions: Sequence[str], golds: Sequence[Sequence[str]], dataset: str = "squad"
) -> dict[str, float]:
    """Mean answer metrics over a dataset, plus `count`; predictions and golds are aligned."""
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions but {len(golds)} gold answer lists")
    rows = [answer_scores(pred, gold, dataset) for pred, gold in zip(predictions, golds, strict=True)]
    return {**mean_scores(rows), "count": float(len(rows))}


# ---------------------------------------------------------------------------------------------------
# KILT downstream metrics


def strict_accuracy(prediction: str, golds: Collection[str]) -> float:
    """KILT's accuracy: the stripped prediction equals a stripped gold exactly (no normalisation)."""
    return float(prediction.strip() in {gold.strip() for gold in golds})


def _rouge_sentences(text: str) -> list[list[str]]:
    """Sentences as the `rouge` package splits them: on ".", empty pieces dropped, words on spaces.

    A piece of only whitespace survives as one empty word, as it does there.
    """
    return [" ".join(piece.split()).split(" ") for piece in text.split(".") if piece]


def _lcs_words(ref: Sequence[str], hyp: Sequence[str]) -> set[str]:
    """The distinct words of one longest common subsequence, backtracked as the `rouge` package does."""
    table = [[0] * (len(hyp) + 1) for _ in range(len(ref) + 1)]
    for i in range(1, len(ref) + 1):
        for j in range(1, len(hyp) + 1):
            if ref[i - 1] == hyp[j - 1]:
                table[i][j] = table[i - 1][j - 1] + 1
            else:
                table[i][j] = max(table[i - 1][j], table[i][j - 1])
    words, i, j = set(), len(ref), len(hyp)
    while i > 0 and j > 0:
        if ref[i - 1] == hyp[j - 1]:
            words.add(ref[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return words


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F-measure as KILT computes it (the `rouge` package, summary level, no normalisation).

    Text splits into sentences at "."; the union of the words of the per-sentence-pair LCSs is compared
    with the DISTINCT words of each side (the package counts words as sets): R = |union| / |ref words|,
    P = |union| / |pred words|, F = 2PR / (P + R + 1e-8). Case matters. A side with no sentences
    (empty, or only dots) scores 0, as KILT's handler of the package's error does.
    """
    hyp, ref = _rouge_sentences(prediction), _rouge_sentences(reference)
    if not hyp or not ref:
        return 0.0
    union: set[str] = set()
    for ref_sentence in ref:
        for hyp_sentence in hyp:
            union |= _lcs_words(ref_sentence, hyp_sentence)
    recall = len(union) / len({w for s in ref for w in s})
    precision = len(union) / len({w for s in hyp for w in s})
    return 2.0 * precision * recall / (precision + recall + 1e-8)


def kilt_gold_answers(golds: Sequence[str]) -> list[str]:
    """KILT's gold answers: the distinct non-empty stripped ones (an empty answer is never gold there)."""
    return list(dict.fromkeys(g.strip() for g in golds if g.strip()))


def kilt_answer_scores(prediction: str, golds: Sequence[str]) -> dict[str, float]:
    """KILT's downstream numbers for one answer, as kilt/eval_downstream.py computes them: on the
    stripped answer, strict accuracy, EM, SQuAD F1 (no yes/no rule) and ROUGE-L against the gold
    answers; an empty answer scores 0 on all four."""
    golds = kilt_gold_answers(golds)
    if not golds:
        raise ValueError("no gold answers to score against")
    answer = prediction.strip()
    if not answer:
        return {"accuracy": 0.0, "em": 0.0, "f1": 0.0, "rougel": 0.0}
    return {
        "accuracy": strict_accuracy(answer, golds),
        "em": max_over_golds(exact_match, answer, golds),
        "f1": max_over_golds(f1, answer, golds),
        "rougel": max_over_golds(rouge_l, answer, golds),
    }


def _unique_stripped(ids: Sequence[str]) -> list[str]:
    seen: dict[str, None] = {}
    for doc_id in ids:
        seen.setdefault(str(doc_id).strip(), None)
    return list(seen)


def r_precision(guess_ids: Sequence[str], gold_sets: Sequence[Sequence[str]]) -> float:
    """KILT page-level R-precision, the max over the gold provenance sets (one per gold output).

    For a set of R distinct ids: the fraction of the first R distinct guessed ids that are in it.
    No gold sets, or no guesses, gives 0.
    """
    guesses = _unique_stripped(guess_ids)
    scores = []
    for gold in gold_sets:
        gold_ids = _unique_stripped(gold)
        hits = sum(guess in gold_ids for guess in guesses[: len(gold_ids)])
        scores.append(hits / len(gold_ids) if gold_ids else 0.0)
    return max(scores, default=0.0)


def _evidence_rank(guess_ids: Sequence[str], gold_sets: Sequence[Sequence[str]]) -> tuple[list[object], int]:
    """KILT's rank of evidence sets: an entry is True where a guess completes a set, False for a miss.

    Each distinct gold set counts as one point, placed at the guess that completes it; partial sets
    are placeholders that move down as more of their ids arrive. Returns the rank and the number of
    distinct gold sets.
    """
    guesses = _unique_stripped(guess_ids)
    if not guesses:
        return [], 0
    evidence: list[set[str]] = []
    for gold in gold_sets:
        ids = {str(doc_id).strip() for doc_id in gold}
        if ids not in evidence:
            evidence.append(ids)
    remaining = [set(ids) for ids in evidence]
    rank: list[object] = []
    for guess in guesses:
        found = False
        for index, ids in enumerate(remaining):
            if guess in ids:
                found = True
                placeholder = f"evidence_set:{index}"
                if placeholder in rank:
                    rank.remove(placeholder)
                ids.remove(guess)
                rank.append(True if not ids else placeholder)
        if not found:
            rank.append(False)
    return rank, len(evidence)


def kilt_recall_at_k(guess_ids: Sequence[str], gold_sets: Sequence[Sequence[str]], k: int) -> float:
    """KILT recall@k: complete gold evidence sets within the first k rank points / distinct sets."""
    if k < 1:
        raise ValueError(f"k must be a positive integer, got {k}")
    rank, num_sets = _evidence_rank(guess_ids, gold_sets)
    return rank[:k].count(True) / num_sets if num_sets else 0.0


def kilt_precision_at_k(guess_ids: Sequence[str], gold_sets: Sequence[Sequence[str]], k: int) -> float:
    """KILT precision@k: complete gold evidence sets within the first k rank points / k."""
    if k < 1:
        raise ValueError(f"k must be a positive integer, got {k}")
    rank, num_sets = _evidence_rank(guess_ids, gold_sets)
    return rank[:k].count(True) / k if num_sets else 0.0


# ---------------------------------------------------------------------------------------------------
# Retrieval


def recall_at_k(ranked_ids: Sequence[str], gold_ids: Collection[str], k: int) -> float:
    """Fraction of the distinct gold ids found among the first k ranked ids."""
    gold = set(gold_ids)
    if not gold:
        raise ValueError("no gold ids to compute recall against")
    if k < 0:
        raise ValueError(f"k must be non-negative, got {k}")
    return len(gold.intersection(ranked_ids[:k])) / len(gold)


def all_found_at_k(ranked_ids: Sequence[str], gold_ids: Collection[str], k: int) -> float:
    """1.0 when every gold id is among the first k ranked ids."""
    return float(recall_at_k(ranked_ids, gold_ids, k) == 1.0)


def reciprocal_rank_fusion(rankings: Sequence[Sequence[str | Hit]], k0: int = 60) -> list[Hit]:
    """Fuse ranked lists: score(d) = sum over lists of 1 / (k0 + rank), rank 1-based.

    An id repeated within one list counts once, at its best rank. Ties keep the order of first
    appearance, reading the lists one after another from the top. Items may be ids or `Hit`s.
    """
    if k0 < 0:
        raise ValueError(f"k0 must be a non-negative integer, got {k0}")
    scores: dict[str, Fraction] = {}  # exact sums, so equal scores tie exactly whatever the order
    for ranking in rankings:
        seen: set[str] = set()
        for rank, item in enumerate(ranking, start=1):
            doc_id = item.doc_id if isinstance(item, Hit) else item
            if doc_id in seen:
                continue
            seen.add(doc_id)
            scores[doc_id] = scores.get(doc_id, Fraction(0)) + Fraction(1, k0 + rank)
    order = {doc_id: index for index, doc_id in enumerate(scores)}
    fused = sorted(scores, key=lambda doc_id: (-scores[doc_id], order[doc_id]))
    return [Hit(doc_id, float(scores[doc_id])) for doc_id in fused]
