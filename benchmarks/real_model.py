"""Every method with a real chat model on real questions: SmolLM2-135M-Instruct on HotpotQA.

The first `--questions` questions of the HotpotQA dev sample (tests/data/samples), a corpus of the sample's
own context paragraphs (`corag corpus from-contexts`), MiniLM dense retrieval over it, and the
packaged SmolLM2-135M-Instruct checkpoint (`corag models smollm2`), in bfloat16 where the CPU has
native bf16 (avx512_bf16 or amx_bf16), else in float32 (`--dtype` overrides). Methods: no retrieval,
single step (IRCoT's one-step baseline), CoRAG greedy L=2, best-of-2 (L=2), IRCoT and SearChain, each
with its default settings and the evaluation's default 64 questions in flight. IRCoT runs without
demonstrations (HotpotQA has no decompositions to build them from).

Per method: EM, F1 and cover-EM (HotpotQA's official rule), recall@5 of the gold passages, tokens and
seconds per question, and the shares of empty predictions, of predictions taken from free text, of
questions with a reply that missed the method's format, and of empty predictions whose reply held words
(target 0). Peak RSS of the process (target <= 4 GB). Accuracy is not a target with a 135M model.
Writes predictions, metrics and the table to `--out-dir`; the last printed line is one JSON object.

    python benchmarks/real_model.py [--questions 30] [--methods no_retrieval ircot ...]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # spinning OpenMP threads stall a shared CPU
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from corag.data.corpus import Corpus, write_context_corpus  # noqa: E402
from corag.data.formats import load_examples  # noqa: E402
from corag.evaluation import Run, run_method, score_records, write_results  # noqa: E402
from corag.lm.settings import EngineSettings  # noqa: E402
from corag.models import convert_smollm2  # noqa: E402
from corag.retrieval.dense import DenseRetriever, Encoder  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "samples" / "hotpotqa" / "hotpot_dev_distractor_sample.json"
RUNS = {
    "no_retrieval": Run("no_retrieval"),
    "single_step": Run("one_step"),
    "corag_greedy_L2": Run("greedy", (("max_steps", 2),)),
    "corag_best_of_2_L2": Run("best_of_n", (("max_steps", 2), ("n", 2))),
    "ircot": Run("ircot"),
    "searchain": Run("searchain"),
}


def native_bf16() -> bool:
    """Whether the CPU computes in bfloat16 natively (otherwise bf16 is emulated and slower)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(?:avx512_bf16|amx_bf16)\b", flags))


def reply_of(record: dict[str, Any]) -> str:
    """The model's own text the prediction was taken from."""
    if record.get("strategy") == "searchain":
        rounds = record.get("rounds") or []
        return rounds[-1]["chain"] if rounds else ""
    return record.get("reader_output", record.get("predictions", ""))


def holds_words(text: str) -> bool:
    return bool(re.sub(r"\b(?:A|Answer)\s*:", " ", text).strip(" \n.:"))


def method_row(name: str, records: list[dict[str, Any]], summary: dict[str, Any], seconds: float) -> dict:
    n = len(records)
    empty = [not r["predictions"].strip() for r in records]
    return {
        "method": name,
        "em": round(summary.get("em", 0.0), 1),
        "f1": round(summary.get("f1", 0.0), 1),
        "cover_em": round(summary.get("cover_em", 0.0), 1),
        "recall@5": round(summary.get("recall@5_chain_rrf", 0.0), 1),
        "tokens_per_question": round(summary["tokens_per_question"], 1),
        "seconds_per_question": round(seconds / n, 2),
        "empty_share": round(sum(empty) / n, 3),
        "from_text_share": round(sum(r.get("answer_source") == "text" for r in records) / n, 3),
        "unparsable_share": round(sum(bool(r.get("parse_failures")) for r in records) / n, 3),
        "empty_with_words_share": round(
            sum(e and holds_words(reply_of(r)) for e, r in zip(empty, records, strict=True)) / n, 3
        ),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: converted)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--methods", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="corag-real-model-"))
    out_dir = args.out_dir or work / "eval"
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if native_bf16() else "float32")

    model = args.model or convert_smollm2(work / "smollm2")
    built, questions = write_context_corpus([args.data], work / "corpus.jsonl")
    examples = load_examples(questions)[: args.questions]
    corpus = Corpus.load(built.path)
    passages = [p for batch in corpus.iter_batches(512) for p in batch]
    start = time.perf_counter()
    retriever = DenseRetriever.from_passages(passages, Encoder.from_preset("minilm", device="cpu"))
    index_seconds = time.perf_counter() - start
    lm = EngineSettings(device="cpu", dtype=dtype).load(str(model))  # the commands' defaults otherwise

    rows, results = [], {}
    for name in args.methods:
        run = RUNS[name]
        start = time.perf_counter()
        records = run_method(
            run, examples, lm, retriever, corpus, out_dir / name / "predictions.jsonl", progress=False
        )
        seconds = time.perf_counter() - start
        summary = score_records(examples, records)
        summary["wall_seconds"] = seconds
        results[name] = summary
        rows.append(method_row(name, [r for r in records if r is not None], summary, seconds))
        print(json.dumps(rows[-1]), flush=True)
    write_results(results, out_dir)
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(markdown(rows))
    print(
        f"{len(examples)} HotpotQA questions, {len(passages)} passages, {dtype}, MiniLM index "
        f"{index_seconds:.1f} s, peak RSS {peak_rss_gb:.2f} GB; predictions and table in {out_dir}"
    )
    print(
        json.dumps(
            {
                "benchmark": "real_model",
                "questions": len(examples),
                "passages": len(passages),
                "dtype": dtype,
                "peak_rss_gb": round(peak_rss_gb, 2),
                "rss_target_met": peak_rss_gb <= 4.0,
                "empty_with_words_max": max(r["empty_with_words_share"] for r in rows),
                "methods": {r["method"]: {k: v for k, v in r.items() if k != "method"} for r in rows},
            }
        )
    )


if __name__ == "__main__":
    main()
