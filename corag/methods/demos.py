"""IRCoT demonstrations: their JSONL file format, and builders from data with gold decompositions.

One demonstration per line: `{"question": str, "answer": str, "cot": str, "paragraphs": [{"title": str,
"text": str, "gold": bool}, ...]}`. The CoT is a few sentences that end with "So the answer is: X.";
the paragraphs are the gold ones plus a few distractors, in the order they are shown. Users supply
their own file, or build one from MuSiQue (its decompositions and paragraphs) or from the toy world
(its gold chains and corpus).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corag.data.jsonl import iter_jsonl, write_jsonl
from corag.errors import InputError
from corag.prompts import ircot_paragraph, ircot_question
from corag.types import Example, Passage

if TYPE_CHECKING:
    from corag.data.corpus import Corpus
    from corag.retrieval.base import Retriever


@dataclass(frozen=True)
class DemoParagraph:
    title: str
    text: str
    gold: bool = False


@dataclass(frozen=True)
class Demonstration:
    """A worked example: question, paragraphs to read, the reasoning and the answer."""

    question: str
    answer: str
    cot: str
    paragraphs: tuple[DemoParagraph, ...] = ()

    def turns(self, reply: str, *, with_paragraphs: bool = True) -> tuple[str, str]:
        """The demonstration as a (user, assistant) pair: its paragraphs and question, then `reply`
        (the CoT or the answer)."""
        paragraphs = [ircot_paragraph(p.title, p.text) for p in self.paragraphs] if with_paragraphs else []
        return ircot_question(paragraphs, self.question), reply

    def to_json(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "answer": self.answer,
            "cot": self.cot,
            "paragraphs": [{"title": p.title, "text": p.text, "gold": p.gold} for p in self.paragraphs],
        }


def _field(record: dict[str, Any], name: str, kind: type, path: str, line: int) -> Any:
    value = record.get(name)
    if not isinstance(value, kind) or (kind is str and not value.strip()):
        raise InputError(f"expected a non-empty {kind.__name__}", file=path, line=line, field=name)
    return value


def parse_demonstration(record: Any, path: str = "<demonstrations>", line: int = 1) -> Demonstration:
    """One demonstration from its JSON object; InputError names the file, line and field."""
    if not isinstance(record, dict):
        raise InputError("expected a JSON object", file=path, line=line)
    paragraphs = []
    for i, item in enumerate(_field(record, "paragraphs", list, path, line)):
        where = f"paragraphs[{i}]"
        if not isinstance(item, dict):
            raise InputError("expected an object", file=path, line=line, field=where)
        for name in ("title", "text"):
            if not isinstance(item.get(name), str):
                raise InputError("expected a string", file=path, line=line, field=f"{where}.{name}")
        if not isinstance(item.get("gold", False), bool):
            raise InputError("expected true or false", file=path, line=line, field=f"{where}.gold")
        paragraphs.append(DemoParagraph(item["title"], item["text"], item.get("gold", False)))
    return Demonstration(
        question=_field(record, "question", str, path, line),
        answer=_field(record, "answer", str, path, line),
        cot=_field(record, "cot", str, path, line),
        paragraphs=tuple(paragraphs),
    )


def load_demonstrations(path: str | Path) -> list[Demonstration]:
    """Read a demonstrations JSONL file (blank lines allowed)."""
    return [parse_demonstration(record, str(path), line_no) for line_no, record in iter_jsonl(path)]


def write_demonstrations(path: str | Path, demos: Iterable[Demonstration]) -> Path:
    """Write demonstrations as JSONL, atomically (a temporary file renamed into place)."""
    write_jsonl(path, (demo.to_json() for demo in demos))
    return Path(path)


_RELATION = re.compile(r"^(.+?)\s*>>\s*(.+)$")
_COPULA = re.compile(r"^(?:who|what|which)\s+(is|was|are|were)\s+(.+?)\s*\??$", re.IGNORECASE)


def step_sentence(subquery: str, subanswer: str) -> str:
    """A declarative CoT sentence for one answered sub-question.

    `X >> relation` (MuSiQue's Wikidata form) reads "The relation of X is A."; "Who is/was Y?" reads
    "Y is/was A."; any other question reads 'The answer to "Q" is A.'.
    """
    subquery, subanswer = subquery.strip(), subanswer.strip().rstrip(".")
    if m := _RELATION.match(subquery):
        return f"The {m.group(2).strip()} of {m.group(1).strip()} is {subanswer}."
    if m := _COPULA.match(subquery):
        subject = m.group(2)
        return f"{subject[:1].upper()}{subject[1:]} {m.group(1).lower()} {subanswer}."
    return f'The answer to "{subquery.rstrip("?")}" is {subanswer}.'


def chain_cot(steps: Sequence[tuple[str, str]], answer: str) -> str:
    """A CoT from (sub-question, sub-answer) pairs, ending with "So the answer is: X."."""
    sentences = [step_sentence(q, a) for q, a in steps]
    return " ".join([*sentences, f"So the answer is: {answer.strip().rstrip('.')}."])


def _resolve(question: str, answers: Sequence[str]) -> str:
    """Replace MuSiQue's `#k` references with the k-th sub-answer."""
    return re.sub(
        r"#(\d+)",
        lambda m: answers[int(m.group(1)) - 1] if int(m.group(1)) <= len(answers) else m.group(0),
        question,
    )


def musique_demonstration(record: dict[str, Any], num_distractors: int, rng: random.Random) -> Demonstration:
    """One demonstration from a raw MuSiQue record: supporting paragraphs, distractors, a CoT."""
    rid = str(record.get("id", "?"))
    try:
        decomposition = record["question_decomposition"]
        paragraphs = record["paragraphs"]
        steps, answers = [], []
        for step in decomposition:
            sub_answer = str(step["answer"])
            steps.append((_resolve(str(step["question"]), answers), sub_answer))
            answers.append(sub_answer)
        gold = [p for p in paragraphs if p["is_supporting"]]
        others = [p for p in paragraphs if not p["is_supporting"]]
        chosen = gold + rng.sample(others, min(num_distractors, len(others)))
        rng.shuffle(chosen)
        shown = tuple(
            DemoParagraph(p["title"], p["paragraph_text"], bool(p["is_supporting"])) for p in chosen
        )
        return Demonstration(record["question"], record["answer"], chain_cot(steps, record["answer"]), shown)
    except (KeyError, TypeError, IndexError) as exc:
        raise InputError(f"not a MuSiQue record ({exc!r})", record=rid) from None


def demos_from_musique(
    path: str | Path, n: int = 15, distractors: tuple[int, int] = (1, 3), seed: int = 0
) -> list[Demonstration]:
    """Up to `n` demonstrations from a MuSiQue JSONL file (answerable records, in file order), each
    with its supporting paragraphs plus 1-3 of the record's own distractor paragraphs."""
    rng = random.Random(seed)
    demos: list[Demonstration] = []
    if n <= 0:
        return demos
    for line_no, record in iter_jsonl(path):
        if not record.get("answerable", True):
            continue
        try:
            demos.append(musique_demonstration(record, rng.randint(*distractors), rng))
        except InputError as exc:
            raise InputError(str(exc), file=str(path), line=line_no) from None
        if len(demos) >= n:
            break
    return demos


def demos_from_examples(
    examples: Sequence[Example],
    corpus: Corpus,
    n: int = 15,
    distractors: tuple[int, int] = (1, 3),
    retriever: Retriever | None = None,
    seed: int = 0,
) -> list[Demonstration]:
    """Demonstrations from examples with gold chains (the toy world's training questions).

    Gold paragraphs are the chain's documents (or `supporting_ids`); distractors are the retriever's
    best non-gold hits for the question when a retriever is given (hard ones, as in the benchmarks),
    otherwise random corpus passages. Examples without a decomposition are skipped.
    """
    rng = random.Random(seed)
    ids = list(corpus.ids)
    demos = []
    for example in examples:
        if len(demos) >= n:
            break
        if not example.decomposition or not example.answers:
            continue
        gold_ids = list(dict.fromkeys([d for s in example.decomposition for d in s.doc_ids]))
        gold_ids = gold_ids or list(example.supporting_ids)
        count = rng.randint(*distractors)
        if retriever is not None:
            hits = retriever.search([example.query], count + len(gold_ids))[0]
            others = [h.doc_id for h in hits if h.doc_id not in gold_ids][:count]
        else:
            pool = [i for i in rng.sample(ids, min(len(ids), count + len(gold_ids))) if i not in gold_ids]
            others = pool[:count]
        shown: list[tuple[Passage, bool]] = [(p, True) for p in corpus.get_many(gold_ids)]
        shown += [(p, False) for p in corpus.get_many(others)]
        rng.shuffle(shown)
        steps = [(s.subquery, s.subanswer) for s in example.decomposition]
        demos.append(
            Demonstration(
                question=example.query,
                answer=example.answers[0],
                cot=chain_cot(steps, example.answers[0]),
                paragraphs=tuple(DemoParagraph(p.title, p.contents, gold) for p, gold in shown),
            )
        )
    return demos
