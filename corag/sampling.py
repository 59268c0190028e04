"""Rejection sampling (as in the CoRAG paper): sample chains per training question, keep the one under which
the gold answer is most likely.

For each question, `num_chains` chains are sampled, each with its own maximum length drawn from
[min_length, max_length]: sub-queries at temperature 0.7, sub-answers greedy over the top-5 documents.
After each step the chain is scored by the mean log-likelihood of the first gold answer (the scoring
prompt is a named option, recorded in the output); a chain stops growing early when its sub-answer
matches a gold answer (normalised EM) or that score exceeds -0.05. The chain with the highest score
is kept.

Questions are sampled in fixed blocks (`--block_size`); shards take whole blocks (`--shard i
--num_shards n`), append each finished block's records to their own file (whole lines, flushed and
synced), and resume by sampling unfinished blocks again, writing only the missing records. Since a
block is always computed as one batch, the output is the same to the bit whether the run was
sharded, interrupted or neither. `corag merge` joins the shards in
input order and checks that every question appears exactly once.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from corag.chain import (
    DEFAULT_LIMITS,
    CorpusLike,
    GenerationLimits,
    call_seed,
    next_subquery,
    scoring_request,
    subanswer,
)
from corag.cluster.stop import StopRequest
from corag.data.jsonl import JsonlAppender, iter_jsonl, read_jsonl, write_jsonl
from corag.errors import InputError
from corag.executor import EXECUTORS, Context, Executor, in_order
from corag.metrics import exact_match, max_over_golds
from corag.prompts import FINAL_NUM_DOCS, NO_INFO, final_answer_messages
from corag.tasks import task_description
from corag.types import Example, Passage, Step

# How a chain is scored: the prompt under which log P(gold answer | query, chain) is measured.
SCORING_PROMPTS = ("final_no_docs", "final_with_docs")


@dataclass
class SamplingConfig:
    """Everything that decides which chains a run produces (hashed into every record)."""

    num_chains: int = field(default=16, metadata={"help": "chains sampled per question"})
    min_length: int = field(default=1, metadata={"help": "shortest maximum chain length drawn"})
    max_length: int = field(default=5, metadata={"help": "longest maximum chain length drawn"})
    temperature: float = field(default=0.7, metadata={"help": "sub-query sampling temperature"})
    top_k: int = field(default=5, metadata={"help": "documents per sub-query"})
    early_stop_logprob: float = field(
        default=-0.05, metadata={"help": "stop a chain once the mean gold log-likelihood exceeds this"}
    )
    scoring_prompt: str = field(
        default="final_no_docs",
        metadata={"help": f"one of {SCORING_PROMPTS}: call C without or with documents"},
    )
    keep_candidates: bool = field(
        default=False, metadata={"help": "also write every sampled chain and its score"}
    )
    seed: int = 0

    def check(self) -> None:
        if self.num_chains < 1:
            raise InputError(f"must be at least 1, got {self.num_chains}", field="num_chains")
        if not 1 <= self.min_length <= self.max_length:
            raise InputError(
                f"need 1 <= min_length <= max_length, got {self.min_length}..{self.max_length}",
                field="min_length",
            )
        if self.scoring_prompt not in SCORING_PROMPTS:
            raise InputError(
                f"unknown scoring prompt; choose one of {SCORING_PROMPTS}", field="scoring_prompt"
            )


@dataclass
class SampledChain:
    steps: tuple[Step, ...]
    score: float
    max_length: int
    early_stop: str | None  # "answer_match", "likelihood", "no_subquery" (an empty one) or None


async def gold_logprob(
    ctx: Context, example: Example, steps: Sequence[Step], passages: Sequence[Passage]
) -> float:
    """Mean log-probability of the first gold answer as call C's answer given the chain."""
    messages = final_answer_messages(
        example.query, steps, task_description(example.task, example.meta), passages, tok=ctx.lm
    )
    request = scoring_request(ctx.lm, messages, example.answers[0])
    return (await ctx.score(request)).mean


async def sample_one_chain(
    ctx: Context,
    example: Example,
    corpus: CorpusLike,
    config: SamplingConfig,
    index: int,
    max_length: int,
    passages: Sequence[Passage],
    limits: GenerationLimits = DEFAULT_LIMITS,
) -> SampledChain:
    """Grow one chain to at most `max_length` steps, scoring it after every step.

    An empty sub-query ends the chain ("no_subquery": the model has nothing more to ask); an empty sub-answer is
    recorded as "No relevant information found", what call B asks the model to say then.
    """
    steps: list[Step] = []
    task_desc = task_description(example.task, example.meta)
    score, early_stop = None, None
    while len(steps) < max_length:
        seed = call_seed(example.id, f"sample-{config.seed}-{index}", len(steps), 0)
        query = await next_subquery(ctx, example.query, steps, task_desc, config.temperature, seed, limits)
        if not query:
            early_stop = "no_subquery"
            break
        step = await subanswer(ctx, query, corpus, k=config.top_k, limits=limits)
        steps.append(step if step.subanswer else Step(step.subquery, NO_INFO, step.doc_ids))
        score = await gold_logprob(ctx, example, steps, passages)
        if max_over_golds(exact_match, steps[-1].subanswer, example.answers):
            early_stop = "answer_match"
        elif score > config.early_stop_logprob:
            early_stop = "likelihood"
        if early_stop:
            break
    if score is None:  # not a single step: the chain is the empty one
        score = await gold_logprob(ctx, example, steps, passages)
    return SampledChain(tuple(steps), score, max_length, early_stop)


def chain_lengths(example_id: str, config: SamplingConfig) -> list[int]:
    """Each chain's maximum length, drawn uniformly, fixed by the question id and the seed."""
    seed = int.from_bytes(
        hashlib.blake2b(f"{config.seed}|{example_id}".encode(), digest_size=8).digest(), "big"
    )
    rng = random.Random(seed)
    return [rng.randint(config.min_length, config.max_length) for _ in range(config.num_chains)]


async def sample_question(
    ctx: Context,
    example: Example,
    corpus: CorpusLike,
    config: SamplingConfig,
    config_hash: str = "",
    limits: GenerationLimits = DEFAULT_LIMITS,
) -> dict[str, Any]:
    """All chains of one question, concurrently; the record of the best one."""
    hits = await ctx.search(example.query, FINAL_NUM_DOCS)
    context_ids = [h.doc_id for h in hits]
    passages = corpus.get_many(context_ids) if config.scoring_prompt == "final_with_docs" else []
    chains: list[SampledChain] = await ctx.gather(
        *(
            sample_one_chain(ctx, example, corpus, config, i, length, passages, limits)
            for i, length in enumerate(chain_lengths(example.id, config))
        )
    )
    best = max(range(len(chains)), key=lambda i: chains[i].score)  # first of equal scores
    record = chain_record(example, chains[best], context_ids, config, config_hash)
    record["tokens"] = ctx.meter.usage.total
    record["model_calls"] = ctx.meter.usage.calls
    if config.keep_candidates:
        record["candidates"] = [
            {
                "subqueries": [s.subquery for s in c.steps],
                "subanswers": [s.subanswer for s in c.steps],
                "doc_ids": [list(s.doc_ids) for s in c.steps],
                "score": round_score(c.score),
                "max_length": c.max_length,
                "early_stop": c.early_stop,
            }
            for c in chains
        ]
    return record


def iter_chain_scores(
    records: Sequence[dict[str, Any]],
    examples: dict[str, Example],
    corpus: CorpusLike,
    lm: Any,
    scoring_prompt: str = SCORING_PROMPTS[0],
) -> Iterator[tuple[int, float]]:
    """(index, score) of each chain record as its scoring finishes, in any order; the score as sampling
    scores a chain: the mean log-likelihood of its question's first gold answer (`examples` by id) given
    the chain, under `scoring_prompt`."""

    async def one(ctx: Context, record: dict[str, Any]) -> float:
        steps = [Step(s["subquery"], s["subanswer"], tuple(s["doc_ids"])) for s in record["steps"]]
        with_docs = scoring_prompt == "final_with_docs"
        passages = corpus.get_many(record["context_doc_ids"]) if with_docs else []
        return round_score(await gold_logprob(ctx, examples[record["query_id"]], steps, passages))

    runner = Executor(lm)
    yield from runner.stream(one(runner.context(), r) for r in records)


def score_chains(
    records: Sequence[dict[str, Any]],
    examples: dict[str, Example],
    corpus: CorpusLike,
    lm: Any,
    scoring_prompt: str = SCORING_PROMPTS[0],
) -> list[float]:
    """Each chain record's score under `lm` (`iter_chain_scores`), in the records' order."""
    scores = [0.0] * len(records)
    scored = iter_chain_scores(records, examples, corpus, lm, scoring_prompt)
    for i, score in tqdm(scored, total=len(records), desc="scoring", unit="chain", file=sys.stderr):
        scores[i] = score
    return scores


def round_score(score: float) -> float:
    """Scores are written to 6 decimals so records do not depend on last-bit float noise of batching."""
    return round(score, 6)


def chain_record(
    example: Example, chain: SampledChain, context_ids: list[str], config: SamplingConfig, config_hash: str
) -> dict[str, Any]:
    """The corag/multihopqa schema (query, answers, query_id, context_doc_ids, subqueries, subanswers,
    predictions) plus per-step document ids, the score and the run's config hash.

    `predictions` is empty: rejection sampling writes no final answer (the fine-tuning stage's
    final-answer target is the gold answer).
    """
    return {
        "query": example.query,
        "answers": list(example.answers),
        "query_id": example.id,
        "context_doc_ids": context_ids,
        "subqueries": [s.subquery for s in chain.steps],
        "subanswers": [s.subanswer for s in chain.steps],
        "predictions": "",
        "task": example.task,
        "steps": [
            {"subquery": s.subquery, "subanswer": s.subanswer, "doc_ids": list(s.doc_ids)}
            for s in chain.steps
        ],
        "score": round_score(chain.score),
        "max_length": chain.max_length,
        "early_stop": chain.early_stop,
        "scoring_prompt": config.scoring_prompt,
        "config_hash": config_hash,
    }


# Validation -----------------------------------------------------------------------------------------


def referenced_ids(example: Example) -> list[str]:
    """Corpus ids a question names: supporting passages, gold chain documents, context documents."""
    ids = list(example.supporting_ids)
    for step in example.decomposition:
        ids.extend(step.doc_ids)
    ids.extend(str(i) for i in example.meta.get("context_doc_ids", ()) or ())
    return ids


def validate_questions(
    examples: Sequence[Example],
    corpus: Any,
    source: str,
    skip_invalid: bool,
    load_errors: Sequence[InputError] = (),
) -> tuple[list[Example], Counter[str]]:
    """Check every question before any work starts: unique ids, answers present, corpus ids exist.

    Without `skip_invalid` the first problem is an InputError naming the file, id and field; with it,
    invalid questions are dropped and counted by field (records the loader already rejected, passed
    as `load_errors`, are counted too; of a duplicated id the first copy is kept).
    """
    skipped: Counter[str] = Counter(error.field or "record" for error in load_errors)
    seen: set[str] = set()
    valid = []
    for example in examples:
        problem: tuple[str, str] | None = None
        if example.id in seen:
            problem = ("duplicate question id", "id")
        elif not example.answers or not example.answers[0].strip():  # an empty alias is an official one
            problem = ("question without answers", "answers")
        else:
            missing = [d for d in referenced_ids(example) if not _in_corpus(corpus, d)]
            if missing:
                problem = (f"corpus has no document {missing[0]!r}", "doc_ids")
        seen.add(example.id)
        if problem is None:
            valid.append(example)
        elif skip_invalid:
            skipped[problem[1]] += 1
        else:
            raise InputError(problem[0], file=source, record=example.id, field=problem[1])
    return valid, skipped


def _in_corpus(corpus: Any, doc_id: str) -> bool:
    try:
        corpus.row(doc_id)
    except InputError:
        return False
    return True


# Shards, resume, merge -------------------------------------------------------------------------------


def shard_path(out_dir: Path, shard: int, num_shards: int) -> Path:
    return out_dir / f"chains-{shard:05d}-of-{num_shards:05d}.jsonl"


def config_hash(values: dict[str, Any]) -> str:
    """A short stable hash of what determines the chains (not of sharding or resume state)."""
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def model_fingerprint(model: str) -> str:
    """What identifies a model wherever its folder lives: its config, tokenizer and chat template files
    and the names and sizes of its weight files (a hub name stands for itself)."""
    folder = Path(model)
    if not folder.is_dir():
        return model
    h = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        if path.suffix in (".safetensors", ".bin", ".pt", ".gguf"):
            h.update(f"{path.name}:{path.stat().st_size}\n".encode())
        elif path.suffix in (".json", ".jinja", ".model", ".txt"):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def questions_fingerprint(examples: Sequence[Example]) -> str:
    """What identifies a question set wherever its file lives: every id, query and answer, in order."""
    h = hashlib.sha256()
    for e in examples:
        h.update(json.dumps([e.id, e.query, list(e.answers)], ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()[:16]


def shard_blocks(
    examples: Sequence[Example], block_size: int, shard: int = 0, num_shards: int = 1
) -> list[list[Example]]:
    """The blocks of questions a shard samples: consecutive blocks of `block_size`, dealt round-robin.

    A block is always sampled as one batch, whatever the sharding and however often the run was
    resumed, so every record is computed in exactly the same batches (and so to the same bits)."""
    blocks = [list(examples[i : i + block_size]) for i in range(0, len(examples), block_size)]
    return blocks[shard::num_shards]


def run_sampling(
    examples: Sequence[Example],
    corpus: CorpusLike,
    lm: Any,
    retriever: Any,
    config: SamplingConfig,
    out_path: Path,
    *,
    hash_inputs: dict[str, Any] | None = None,
    limits: GenerationLimits = DEFAULT_LIMITS,
    block_size: int = 64,
    shard: int = 0,
    num_shards: int = 1,
    progress: bool = True,
    dedup: bool = True,
    executor: str = "stepped",
    stop: StopRequest | None = None,
) -> dict[str, Any]:
    """Sample this shard's questions not yet in `out_path`; return the summary.

    Once `stop` is set (Slurm's warning before the time limit), the run ends after the block in hand
    (with the async executor: after the record in hand), everything finished written; the summary's
    `stopped` says so, and a rerun samples the rest.

    With `dedup`, identical greedy or seeded calls are computed once (the records do not change);
    the summary's `dedup_saved_share` is the share of prompt tokens this saved.

    `executor="stepped"` samples one block at a time as one batch and appends its records (whole lines,
    flushed and synced) when the block finishes; a block that a crash interrupted is sampled again in
    full, and only its missing records are written. `executor="async"` streams the unfinished blocks'
    questions through corag.executor, `block_size` of them in flight, with no barrier between
    blocks: each record is appended as soon as it and every question before it are done (question order
    kept), and a resumed run skips the written records as before. Batches then form by timing, so on a
    GPU the chains can differ from the stepped run's at the level of rounding.
    """
    if executor not in EXECUTORS:
        raise InputError(
            f"unknown executor {executor!r}; choose one of {sorted(EXECUTORS)}", field="executor"
        )
    config.check()
    digest = config_hash({**asdict(config), **(hash_inputs or {})})
    with JsonlAppender(out_path) as out:
        done = {r["query_id"] for r in out.existing}
        for record in out.existing:
            if record.get("config_hash") != digest:
                raise InputError(
                    "this file was written with another config (delete it or use another --out_dir)",
                    file=str(out_path),
                    record=record.get("query_id"),
                    field="config_hash",
                )
        blocks = [
            b
            for b in shard_blocks(examples, block_size, shard, num_shards)
            if any(e.id not in done for e in b)
        ]
        todo = sum(len(b) for b in blocks)
        start, tokens, chains, sampled = time.perf_counter(), 0, 0, 0
        bar = tqdm(total=todo, desc="sampling", unit="q", disable=not progress, file=sys.stderr)

        def finished(records: list[dict[str, Any]]) -> None:
            nonlocal tokens, chains, sampled
            sampled += len(records)
            for record in records:
                if record["query_id"] not in done:
                    out.append(record)
            tokens += sum(r["tokens"] for r in records)
            chains += config.num_chains * len(records)
            elapsed = max(time.perf_counter() - start, 1e-9)
            bar.set_postfix(chains_s=f"{chains / elapsed:.1f}", tok_s=f"{tokens / elapsed:.0f}")
            bar.update(len(records))

        runner = EXECUTORS[executor](lm, retriever, max_active=block_size, dedup=dedup)

        def coros(questions: list[Example]) -> list[Any]:
            return [sample_question(runner.context(), e, corpus, config, digest, limits) for e in questions]

        halted = False
        if executor == "async":  # every unfinished question in one stream, no barrier between blocks
            for record in in_order(runner.stream(coros([e for block in blocks for e in block]))):
                finished([record])
                if stop is not None and stop.received:
                    halted = sampled < todo
                    break
        else:
            for block in blocks:
                if stop is not None and stop.received:
                    halted = True
                    break
                finished(runner.run(coros(block)))
        bar.close()
    records = read_jsonl(out_path)
    summary = summarize(records)
    summary.update(
        resumed_from=len(done), sampled_now=sampled, dropped_partial_lines=out.dropped, stopped=halted
    )
    stats = runner.dedup_stats
    summary["dedup_saved_share"] = stats["saved_prompt_tokens"] / max(stats["prompt_tokens"], 1)
    return summary


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Chains kept, mean score, chain length histogram and early-stop rate."""
    if not records:
        return {"chains_kept": 0}
    lengths = Counter(len(r["subqueries"]) for r in records)
    stops = Counter(r.get("early_stop") or "none" for r in records)
    return {
        "chains_kept": len(records),
        "mean_score": sum(r["score"] for r in records) / len(records),
        "length_histogram": {str(k): lengths[k] for k in sorted(lengths)},
        "early_stop_rate": 1.0 - stops["none"] / len(records),
        "early_stops": dict(stops),
        "mean_tokens_per_question": sum(r.get("tokens", 0) for r in records) / len(records),
    }


def merge_shards(shard_files: Sequence[Path], examples: Sequence[Example], out: Path) -> int:
    """Join shard files into `out` in the questions' order; every id exactly once, or an InputError."""
    by_id: dict[str, dict[str, Any]] = {}
    for path in shard_files:
        for line_no, record in iter_jsonl(path):
            qid = record.get("query_id")
            if qid in by_id:
                raise InputError(
                    "duplicate question id across shards",
                    file=str(path),
                    line=line_no,
                    record=qid,
                    field="query_id",
                )
            by_id[qid] = record
    wanted = [e.id for e in examples]
    missing = [q for q in wanted if q not in by_id]
    if missing:
        raise InputError(
            f"{len(missing)} question(s) missing from the shards, first {missing[:5]}", field="query_id"
        )
    extra = sorted(set(by_id) - set(wanted))
    if extra:
        raise InputError(f"{len(extra)} record(s) for unknown questions, first {extra[:5]}", field="query_id")
    return write_jsonl(out, (by_id[q] for q in wanted))
