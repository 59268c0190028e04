"""Three-task SFT examples built from retrieval chains (as in the CoRAG paper), ready for trl.

A chain record (the sampling stage's output, in the corag/multihopqa schema) yields:
- next sub-query: call A with steps < i, target sub-query i;
- sub-answer: call B with sub-query i and its top-5 documents, target sub-answer i;
- final answer: call C with all steps and the top-20 documents for the question, target the first gold answer;
- optionally, learned stop: the Yes/No question after each step (see `stop_targets`).

Ratio reading: the paper keeps "sub-query and sub-answer examples at a ratio of 0.2". We read it as: each
sub-query and each sub-answer example is kept independently with probability `ratio`, decided by a seeded
draw per example (deterministic, independent of record order and sharding); final-answer examples are all
kept, and so are stop examples. Documents are only looked up (or re-retrieved) for examples that are kept.

Examples are conversational prompt/completion dicts ({"prompt": [user], "completion": [assistant],
"task", "id", and the provenance "chain_id" and "step"}). `tokenize_example` turns one into input_ids/labels where exactly the target's content
tokens and the template's end-of-turn token carry labels, whatever the chat template puts around them.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from corag import prompts
from corag.data.jsonl import iter_jsonl
from corag.errors import InputError
from corag.lm.base import Message
from corag.retrieval.base import Retriever
from corag.types import Passage, Step

TASKS = ("subquery", "subanswer", "final", "stop")
DEFAULT_RATIO = 0.2


@dataclass(frozen=True)
class ChainRecord:
    """One sampled chain: the question, its gold answers, the steps and the question's documents."""

    id: str
    query: str
    answers: tuple[str, ...]
    steps: tuple[Step, ...]
    context_doc_ids: tuple[str, ...] = ()
    task: str = "multihopqa"
    score: float | None = None
    prefix_scores: tuple[float, ...] | None = None


class PassageStore(Protocol):
    """The part of a corpus the examples need (corag.data.corpus.Corpus has it)."""

    def get_many(self, ids: Sequence[str]) -> list[Passage]: ...


# ----------------------------------------------------------------------------------------------- input


def _str_list(obj: Mapping[str, Any], key: str, rid: str, where: dict[str, Any]) -> list[str]:
    value = obj.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, (str, int)) for v in value):
        raise InputError("must be a list of strings", record=rid, field=key, **where)
    return [str(v) for v in value]


def _step_doc_ids(steps: Any, n: int, rid: str, where: dict[str, Any]) -> list[list[str]]:
    if not isinstance(steps, list) or len(steps) != n or not all(isinstance(s, Mapping) for s in steps):
        raise InputError(f"must hold one object per sub-query ({n})", record=rid, field="steps", **where)
    out = []
    for i, step in enumerate(steps):
        ids = step.get("doc_ids", [])
        if not isinstance(ids, list) or not all(isinstance(d, (str, int)) for d in ids):
            raise InputError("must be a list of ids", record=rid, field=f"steps[{i}].doc_ids", **where)
        out.append([str(d) for d in ids])
    return out


def _number(value: Any, field: str, rid: str, where: dict[str, Any]) -> float:
    """A score as a float; a string, a bool or a null among numbers is refused, naming the field."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"expected a number, got {type(value).__name__}", record=rid, field=field, **where)
    return float(value)


def parse_chain(obj: Mapping[str, Any], *, file: str | None = None, line: int | None = None) -> ChainRecord:
    """Validate one chain record; a bad one raises InputError naming the record id and the field."""
    where: dict[str, Any] = {"file": file, "line": line}
    if not isinstance(obj, Mapping):
        raise InputError("a chain record must be a JSON object", **where)
    rid = obj.get("query_id", obj.get("id"))
    if rid is None or str(rid) == "":
        raise InputError("missing record id", field="query_id", **where)
    rid = str(rid)
    query = obj.get("query")
    if not isinstance(query, str) or not query.strip():
        raise InputError("must be a non-empty string", record=rid, field="query", **where)
    answers = _str_list(obj, "answers", rid, where)
    if not answers or not answers[0].strip():
        raise InputError("needs at least one non-empty gold answer", record=rid, field="answers", **where)
    subqueries = _str_list(obj, "subqueries", rid, where)
    subanswers = _str_list(obj, "subanswers", rid, where)
    if len(subqueries) != len(subanswers):
        raise InputError(
            f"{len(subqueries)} subqueries but {len(subanswers)} subanswers",
            record=rid,
            field="subanswers",
            **where,
        )
    for key, values in (("subqueries", subqueries), ("subanswers", subanswers)):
        if any(not v.strip() for v in values):
            raise InputError("holds an empty string", record=rid, field=key, **where)
    step_docs: list[list[str]] = [[] for _ in subqueries]
    if obj.get("steps") is not None:  # `corag sample` records: the documents each step read
        step_docs = _step_doc_ids(obj["steps"], len(subqueries), rid, where)
    elif obj.get("doc_ids") is not None:
        raw = obj["doc_ids"]
        if (
            not isinstance(raw, list)
            or len(raw) != len(subqueries)
            or not all(isinstance(d, list) for d in raw)
        ):
            raise InputError("must hold one list of ids per step", record=rid, field="doc_ids", **where)
        step_docs = [[str(d) for d in docs] for docs in raw]
    prefix_scores = obj.get("prefix_scores")
    if prefix_scores is not None:
        if not isinstance(prefix_scores, list) or len(prefix_scores) != len(subqueries) + 1:
            raise InputError(
                "must hold one score per prefix (steps + 1)", record=rid, field="prefix_scores", **where
            )
        prefix_scores = tuple(_number(s, "prefix_scores", rid, where) for s in prefix_scores)
    steps = tuple(
        Step(q.strip(), a.strip(), tuple(d))
        for q, a, d in zip(subqueries, subanswers, step_docs, strict=True)
    )
    return ChainRecord(
        id=rid,
        query=query.strip(),
        answers=tuple(a.strip() for a in answers),
        steps=steps,
        context_doc_ids=tuple(_str_list(obj, "context_doc_ids", rid, where)),
        task=str(obj.get("task") or "multihopqa"),
        score=None if obj.get("score") is None else _number(obj["score"], "score", rid, where),
        prefix_scores=prefix_scores,
    )


def iter_chains(path: str | Path, min_score: float | None = None) -> Iterator[ChainRecord]:
    """Chain records streamed from JSONL, one at a time; errors name the file, line and record.

    With `min_score`, rejection: a chain whose score (the mean log-likelihood of the gold answer given
    the chain) is below it is left out, so the model never learns to give the gold answer after a chain
    that does not lead to it. By default every record is kept, as the paper keeps each question's best.
    """
    for lineno, obj in iter_jsonl(path):
        chain = parse_chain(obj, file=str(path), line=lineno)
        if min_score is not None and chain.score is None:
            where = {"file": str(path), "line": lineno, "record": chain.id}
            raise InputError("has no score to compare with min_score", field="score", **where)
        if min_score is None or chain.score >= min_score:
            yield chain


def load_chains(path: str | Path, min_score: float | None = None) -> list[ChainRecord]:
    """All chain records of a JSONL file (see `iter_chains`)."""
    return list(iter_chains(path, min_score))


# ------------------------------------------------------------------------------------------ truncation


class TokenizerTruncator:
    """Token-level truncation with a Hugging Face tokenizer, as the LM protocol's `truncate_tokens`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def truncate_tokens(self, text: str, max_tokens: int, *, middle: bool = False) -> str:
        """Cut `text` to `max_tokens` tokens: keep the start, or with `middle` the first and last halves."""
        backend = getattr(
            self.tokenizer, "_tokenizer", None
        )  # a fast tokenizer's Rust core: same ids, less overhead
        if backend is not None:
            ids = backend.encode(text, add_special_tokens=False).ids
        else:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= max_tokens:
            return text
        if middle:  # the first half gets the odd token, as in corag.lm
            tail = max_tokens // 2
            ids = ids[: max_tokens - tail] + (ids[len(ids) - tail :] if tail else [])
        else:
            ids = ids[:max_tokens]
        return self.tokenizer.decode(ids, skip_special_tokens=False)


# ------------------------------------------------------------------------------------------- stopping


def stop_targets(prefix_scores: Sequence[float]) -> list[str]:
    """Learned-stop targets for prefixes 1..L from the final answer's log-likelihood given prefixes 0..L.

    `prefix_scores[i]` scores the gold answer given the first i steps. The target after step i is "Yes"
    when i is at or past the best prefix (the first argmax), else "No".
    """
    best = max(range(len(prefix_scores)), key=lambda i: (prefix_scores[i], -i))
    return [prompts.STOP_YES if i >= best else prompts.STOP_NO for i in range(1, len(prefix_scores))]


def lm_prefix_scorer(lm: Any, batch_size: int = 64) -> Callable[[Sequence[ChainRecord]], list[list[float]]]:
    """Prefix scores from an LM: mean log-probability of the first gold answer as call C's assistant turn
    (no documents) after each prefix of the chain, the same reading as the sampling stage's chain score."""
    from corag.lm.base import ScoreRequest

    def score(chains: Sequence[ChainRecord]) -> list[list[float]]:
        requests = [
            ScoreRequest(
                tuple(prompts.final_answer_messages(c.query, c.steps[:i], prompts.task_description(c.task))),
                c.answers[0],
            )
            for c in chains
            for i in range(len(c.steps) + 1)
        ]
        means = []
        for start in tqdm(
            range(0, len(requests), batch_size), desc="stop scores", disable=len(requests) < 1000
        ):
            means.extend(s.mean for s in lm.score(requests[start : start + batch_size]))
        out, pos = [], 0
        for c in chains:
            out.append(means[pos : pos + len(c.steps) + 1])
            pos += len(c.steps) + 1
        return out

    return score


# ------------------------------------------------------------------------------------------ examples


def keep(seed: int, *key: object, ratio: float) -> bool:
    """A seeded draw for one example, stable across runs, orders and shards."""
    return random.Random(":".join(map(str, (seed, *key)))).random() < ratio


def _example(task: str, rid: str, index: int, messages: list[Message], target: str) -> dict[str, Any]:
    return {
        "prompt": messages,
        "completion": [{"role": "assistant", "content": target}],
        "task": task,
        "id": f"{rid}/{task}/{index}",
        "chain_id": rid,
        "step": index,
    }


def _hits_ids(retriever: Retriever | None, queries: list[str], k: int, what: str) -> list[list[str]]:
    if not queries:
        return []
    if retriever is None:
        raise InputError(
            f"{len(queries)} {what} have no document ids to read and nothing to re-retrieve them with: "
            "set `index` (an index folder) or `retriever_url` (a `corag serve-retriever` address)",
            field="index",
        )
    hits = []
    for start in tqdm(range(0, len(queries), 256), desc=f"re-retrieve {what}", disable=len(queries) < 1000):
        hits.extend(retriever.search(queries[start : start + 256], k))
    return [[h.doc_id for h in row] for row in hits]


def build_examples(
    chains: Iterable[ChainRecord],
    corpus: PassageStore,
    *,
    retriever: Retriever | None = None,
    truncator: prompts.Truncator | None = None,
    ratio: float = DEFAULT_RATIO,
    seed: int = 0,
    stop: bool = False,
    prefix_scores: Callable[[Sequence[ChainRecord]], list[list[float]]]
    | Mapping[str, Sequence[float]]
    | None = None,
) -> list[dict[str, Any]]:
    """All examples of the chains, in chain order: sub-query, sub-answer, final (and stop) per chain.

    Steps without doc ids, and questions without context_doc_ids, are re-retrieved with `retriever`
    (top 5 per sub-query, top 20 per question), batched. With `stop`, each record's prefix scores come
    from the record itself, else from `prefix_scores` (a mapping by record id or a batch callable).
    """
    chains = list(chains)
    # Decide what is kept first, so retrieval runs only for kept examples.
    kept_sq = [[keep(seed, c.id, "subquery", i, ratio=ratio) for i in range(len(c.steps))] for c in chains]
    kept_sa = [[keep(seed, c.id, "subanswer", i, ratio=ratio) for i in range(len(c.steps))] for c in chains]
    need_steps = [
        (ci, i)
        for ci, c in enumerate(chains)
        for i, s in enumerate(c.steps)
        if kept_sa[ci][i] and not s.doc_ids
    ]
    need_ctx = [ci for ci, c in enumerate(chains) if not c.context_doc_ids]
    step_ids = dict(
        zip(
            need_steps,
            _hits_ids(retriever, [chains[ci].steps[i].subquery for ci, i in need_steps], 5, "sub-queries"),
            strict=True,
        )
    )
    ctx_ids = dict(
        zip(
            need_ctx,
            _hits_ids(retriever, [chains[ci].query for ci in need_ctx], 20, "questions"),
            strict=True,
        )
    )
    scores = _stop_scores(chains, prefix_scores) if stop else {}

    examples: list[dict[str, Any]] = []
    for ci, c in enumerate(tqdm(chains, desc="build examples", disable=len(chains) < 1000)):
        task_desc = prompts.task_description(c.task)
        for i, step in enumerate(c.steps):
            if kept_sq[ci][i]:
                messages = prompts.subquery_messages(c.query, c.steps[:i], task_desc, truncator)
                examples.append(_example("subquery", c.id, i, messages, step.subquery))
            if kept_sa[ci][i]:
                ids = list(step.doc_ids or step_ids[(ci, i)])[: prompts.SUBANSWER_NUM_DOCS]
                messages = prompts.subanswer_messages(step.subquery, corpus.get_many(ids), truncator)
                examples.append(_example("subanswer", c.id, i, messages, step.subanswer))
        ids = list(c.context_doc_ids or ctx_ids[ci])[: prompts.FINAL_NUM_DOCS]
        messages = prompts.final_answer_messages(c.query, c.steps, task_desc, corpus.get_many(ids), truncator)
        examples.append(_example("final", c.id, 0, messages, c.answers[0]))
        if stop:
            for i, target in enumerate(stop_targets(scores[c.id]), start=1):
                messages = prompts.stop_messages(c.query, c.steps[:i], task_desc, truncator)
                examples.append(_example("stop", c.id, i, messages, target))
    return examples


def _stop_scores(
    chains: list[ChainRecord],
    source: Callable[[Sequence[ChainRecord]], list[list[float]]] | Mapping[str, Sequence[float]] | None,
) -> dict[str, Sequence[float]]:
    scores: dict[str, Sequence[float]] = {
        c.id: c.prefix_scores for c in chains if c.prefix_scores is not None
    }
    missing = [c for c in chains if c.id not in scores]
    if isinstance(source, Mapping):
        scores.update({c.id: source[c.id] for c in missing if c.id in source})
    elif source is not None and missing:
        scores.update({c.id: s for c, s in zip(missing, source(missing), strict=True)})
    for c in chains:
        if c.id not in scores:
            raise InputError(
                "stop examples need prefix scores and none were given", record=c.id, field="prefix_scores"
            )
        if len(scores[c.id]) != len(c.steps) + 1:
            raise InputError("needs one score per prefix (steps + 1)", record=c.id, field="prefix_scores")
    return scores


def load_example_file(path: str | Path) -> list[dict[str, Any]]:
    """Prebuilt examples (prompt/completion JSONL, as `build_examples` or corag.toy.warmstart write them),
    checked: an InputError names the line and field of a malformed one."""
    examples = []
    for line, record in iter_jsonl(path):
        where = {"file": str(path), "line": line, "record": str(record.get("id"))}
        for key in ("prompt", "completion"):
            turns = record.get(key)
            if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) for t in turns):
                raise InputError("expected a non-empty list of chat messages", field=key, **where)
        if record.get("task") not in TASKS:
            raise InputError(f"expected one of {TASKS}", field="task", **where)
        examples.append(record)
    return examples


def to_dataset(examples: Sequence[Mapping[str, Any]]) -> Any:
    """The examples as a `datasets.Dataset` (prompt, completion, task, id)."""
    from datasets import Dataset

    return Dataset.from_list([dict(e) for e in examples])


# ---------------------------------------------------------------------------------------- tokenization


def tokenize_example(
    tokenizer: Any,
    prompt: Sequence[Message],
    completion: Sequence[Message],
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, list[int]]:
    """input_ids and labels for one prompt/completion pair, rendered with the tokenizer's chat template.

    Labels (else -100) fall on exactly the completion's content tokens and the one token the template
    emits right after the content (its end of turn). Whatever a template adds to an assistant turn before
    the content (Qwen3's empty think block) stays unlabelled input, and what it adds after the end of turn
    (Qwen3's trailing newline) is dropped. The rendered text is tokenized without adding special tokens,
    so the template's own BOS is the only one.
    """
    kwargs = dict(chat_template_kwargs or {})
    (assistant,) = completion
    content = assistant["content"]
    prompt_text = tokenizer.apply_chat_template(
        list(prompt), tokenize=False, add_generation_prompt=True, **kwargs
    )
    full_text = tokenizer.apply_chat_template(list(prompt) + list(completion), tokenize=False, **kwargs)
    shared = len(os.path.commonprefix([prompt_text, full_text]))
    start = full_text.find(content, shared)
    if not content or start < 0:
        raise ValueError(f"the chat template does not render the assistant content verbatim: {content!r}")
    end = start + len(content)
    encoded = tokenizer(full_text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    inside = [j for j, (s, e) in enumerate(offsets) if e > start and s < end]
    last = inside[-1] + 1  # the end-of-turn token
    if last >= len(ids) or offsets[last][0] < end:
        raise ValueError("the chat template emits no end-of-turn token after the assistant content")
    ids = ids[: last + 1]
    labels = [-100] * inside[0] + ids[inside[0] :]
    return {"input_ids": ids, "labels": labels}


def tokenize_dataset(
    dataset: Any,
    tokenizer: Any,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    num_proc: int | None = None,
    **map_kwargs: Any,
) -> Any:
    """Add input_ids/labels (and their length) to a prompt/completion Dataset; trl's SFTTrainer then skips
    its own tokenization and label building, and only truncates or packs."""

    def tokenize(ex: Mapping[str, Any]) -> dict[str, Any]:
        tokens: dict[str, Any] = tokenize_example(
            tokenizer, ex["prompt"], ex["completion"], chat_template_kwargs
        )
        tokens["length"] = len(tokens["input_ids"])
        return tokens

    return dataset.map(tokenize, desc="tokenize", num_proc=num_proc, **map_kwargs)
