"""Retrieval at KILT scale on one machine: the corpus store, BM25 and dense indexes, measured on synthetic
corpora generated under a temporary folder, each figure extrapolated to the 35.7M-passage KILT corpus.

Phases run in their own processes, so each peak RSS (VmHWM) is that phase's alone:
- corpora of 1M and 5M passages (about 100 words each; 5M is over 2 GiB of text) as JSONL;
- conversion to the store (`corag corpus prepare`): seconds, peak RSS, store size;
- lookups of 20 random ids, 10,000 times: p50 / p99 latency and RSS growth; at 1M also the same
  lookups from every passage held in a Python list (the baseline a naive loader gives);
- BM25 at 1M: the streamed build's peak RSS and seconds against bm25s's own in-memory build
  (token id lists), then queries/s of the memory-mapped index;
- dense: released-layout fp16 shards of clustered 1024-d vectors imported, the index opened (RSS
  growth against its file size), exact search; IVF-PQ with exact re-scoring at its memory share
  and recall@20 against exact search; IVF-Flat and HNSW on a smaller sample.

Run: python benchmarks/corpus.py [--sizes 1000000,5000000] [--dense-rows 1000000] [--workdir DIR]
It takes 15-20 minutes on 2 cores. The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

KILT = 35_700_000
WORDS_PER_PASSAGE = 100
LOOKUPS, IDS_PER_LOOKUP = 10_000, 20


def rss_mb(field: str = "VmRSS") -> float:
    """A memory figure of this process from /proc (VmRSS, VmHWM = peak, RssAnon, RssFile), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def vocabulary(size: int = 200_000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic words and Zipf-like frequencies (rank^-1.1), as natural text roughly has."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = rng.integers(2, 9, size)  # 5 letters on average, as English words
    words = np.array(["".join(rng.choice(letters, n)) for n in lengths])
    p = 1.0 / np.arange(1, size + 1) ** 1.1
    return words, p / p.sum()


# Phases (each runs in its own process) -------------------------------------------------------------


def phase_generate(path: str, rows: int, seed: int) -> dict:
    """Corpus JSONL of `rows` passages (title of 2-4 words, contents of ~100 words)."""
    words, p = vocabulary()
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    with open(path, "w", encoding="utf-8") as f:
        for a in range(0, rows, 20_000):
            n = min(20_000, rows - a)
            body = words[rng.choice(len(words), (n, WORDS_PER_PASSAGE), p=p)]
            titles = words[rng.integers(0, len(words), (n, 3))]
            lines = [
                json.dumps({"title": " ".join(t[: 2 + (a + i) % 3 // 2]), "contents": " ".join(b)})
                for i, (t, b) in enumerate(zip(titles, body, strict=True))
            ]
            f.write("\n".join(lines) + "\n")
    return {"seconds": time.perf_counter() - start, "bytes": os.path.getsize(path)}


def phase_prepare(source: str, store: str) -> dict:
    from corag.data.corpus import prepare_corpus

    start = time.perf_counter()
    prepare_corpus(source, store)
    size = sum(p.stat().st_size for p in Path(store).iterdir())
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": rss_mb("VmHWM"), "store_bytes": size}


def _lookup_ids(rows: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [[str(r) for r in rng.integers(0, rows, IDS_PER_LOOKUP)] for _ in range(LOOKUPS)]


def _time_lookups(get_many, ids: list[list[str]]) -> tuple[list[float], int]:
    times, chars = [], 0
    for batch in ids:
        start = time.perf_counter()
        passages = get_many(batch)
        times.append(time.perf_counter() - start)
        chars += sum(len(p.contents) for p in passages)
    return times, chars


def phase_lookup(store: str, rows: int) -> dict:
    from corag.data.corpus import Corpus

    before = rss_mb()
    corpus = Corpus(store)
    opened = rss_mb()
    _time_lookups(corpus.get_many, _lookup_ids(rows, 1)[:200])  # warm-up
    times, _ = _time_lookups(corpus.get_many, _lookup_ids(rows, 2))
    ms = np.array(times) * 1000
    return {
        "open_rss_growth_mb": opened - before,
        "rss_growth_mb": rss_mb() - opened,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
    }


def phase_lookup_in_memory(source: str, rows: int) -> dict:
    """The baseline: every passage read into a Python list, looked up by row."""
    from corag.types import Passage

    before = rss_mb()
    passages = []
    with open(source, encoding="utf-8") as f:
        for i, line in enumerate(f):
            r = json.loads(line)
            passages.append(Passage(str(i), r["title"], r["contents"]))
    loaded = rss_mb()
    times, _ = _time_lookups(lambda ids: [passages[int(i)] for i in ids], _lookup_ids(rows, 2))
    ms = np.array(times) * 1000
    return {"load_rss_growth_mb": loaded - before, "p50_ms": float(np.percentile(ms, 50))}


def _queries(n: int, seed: int) -> list[str]:
    words, p = vocabulary()
    rng = np.random.default_rng(seed)
    return [" ".join(words[rng.choice(len(words), 5, p=p)]) for _ in range(n)]


def phase_bm25(store: str, out: str) -> dict:
    from corag.data.corpus import Corpus
    from corag.retrieval.index import build_bm25

    start = time.perf_counter()
    build_bm25(Corpus(store), out)
    size = sum(p.stat().st_size for p in Path(out).iterdir())
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": rss_mb("VmHWM"), "index_bytes": size}


def phase_bm25_baseline(store: str) -> dict:
    """bm25s's own build from token id lists held in memory (what `corag index` did before)."""
    import bm25s

    from corag.data.corpus import Corpus
    from corag.retrieval.bm25 import tokenize

    start = time.perf_counter()
    vocab: dict[str, int] = {}
    docs = [
        [vocab.setdefault(t, len(vocab)) for t in tokenize(f"{p.title} {p.contents}")]
        for batch in Corpus(store).iter_batches(8192)
        for p in batch
    ]
    bm25s.BM25(k1=1.2, b=0.75).index((docs, vocab), show_progress=False)
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": rss_mb("VmHWM")}


def phase_bm25_search(out: str) -> dict:
    from corag.retrieval.bm25 import BM25Retriever

    before = rss_mb()
    retriever = BM25Retriever.load(out)
    opened, anon, mapped = rss_mb(), rss_mb("RssAnon"), rss_mb("RssFile")
    queries = _queries(200, 3)
    retriever.search(queries[:10], 20)
    start = time.perf_counter()
    for q in queries:
        retriever.search([q], 20)
    return {
        "qps": len(queries) / (time.perf_counter() - start),
        "open_rss_growth_mb": opened - before,
        "search_rss_growth_mb": rss_mb() - opened,
        # the mapped index pages of the queried tokens' columns: page cache shared by processes
        "search_mapped_growth_mb": rss_mb("RssFile") - mapped,
        "search_private_growth_mb": rss_mb("RssAnon") - anon,
    }


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def clustered_vectors(rows: int, dim: int, seed: int, centres: int = 2000, rank: int = 64) -> np.ndarray:
    """Unit vectors around `centres` cluster centres: centre + a spread of norm 0.7 in a shared
    `rank`-dimensional subspace + isotropic noise of norm 0.3. Clustered, anisotropic data like
    sentence embeddings have; not their values, so real recall must be measured on real vectors."""
    rng = np.random.default_rng(seed)
    shared = np.random.default_rng(12345)
    centre = _unit(shared.standard_normal((centres, dim)))
    basis = shared.standard_normal((rank, dim)).astype(np.float32)
    spread = _unit(rng.standard_normal((rows, rank)).astype(np.float32) @ basis)
    noise = _unit(rng.standard_normal((rows, dim)).astype(np.float32))
    return _unit(centre[rng.integers(0, centres, rows)] + 0.7 * spread + 0.3 * noise)


def synthetic_encoder(dim: int) -> SimpleNamespace:
    """The fields of an encoder the import records (no model is loaded for synthetic vectors)."""
    return SimpleNamespace(
        name=f"synthetic-{dim}", dim=dim, query_prefix="", passage_prefix="", query_max_length=None
    )


def phase_shards(shards: str, rows: int, dim: int) -> dict:
    """Released-layout fp16 torch shards (`e5-large-shard-N.pt`) of clustered vectors."""
    import torch

    Path(shards).mkdir(parents=True, exist_ok=True)
    per_shard = -(-rows // 8)
    for i, a in enumerate(range(0, rows, per_shard)):
        part = clustered_vectors(min(per_shard, rows - a), dim, seed=100 + i)
        torch.save(torch.from_numpy(part).half(), Path(shards) / f"e5-large-shard-{i}.pt")
    return {"shards": i + 1}


def phase_dense_import(store: str, shards: str, out: str, dim: int) -> dict:
    from corag.data.corpus import Corpus
    from corag.retrieval.index import import_embeddings

    start = time.perf_counter()
    import_embeddings(Corpus(store), out, shards, synthetic_encoder(dim))  # type: ignore[arg-type]
    return {
        "seconds": time.perf_counter() - start,
        "peak_rss_mb": rss_mb("VmHWM"),
        "peak_anon_mb": rss_mb("RssAnon"),
    }


def _query_vectors(index, n: int, seed: int) -> np.ndarray:
    """Queries near corpus vectors (a corpus vector plus noise of norm 0.35), as a question lies near
    its passages."""
    rng = np.random.default_rng(seed)
    q = index.vectors(np.sort(rng.choice(index.ntotal, n, replace=False)))
    return _unit(q + 0.35 * _unit(rng.standard_normal(q.shape).astype(np.float32)))


def phase_dense_search(out: str) -> dict:
    from corag.retrieval.base import read_manifest
    from corag.retrieval.dense import ExactIndex, index_chunks

    before = rss_mb()
    manifest = read_manifest(Path(out), "dense")
    index = ExactIndex(index_chunks(Path(out), manifest))
    opened = rss_mb()
    size = sum((Path(out) / c["file"]).stat().st_size for c in manifest["chunks"])
    queries = _query_vectors(index, 256, 5)
    start = time.perf_counter()
    index.search(queries, 20)
    seconds = time.perf_counter() - start
    return {
        "file_bytes": size,
        "load_rss_growth_mb": opened - before,
        "load_rss_growth_ratio": (opened - before) * 2**20 / size,
        "search_rss_growth_mb": rss_mb() - opened,
        "search_256_seconds": seconds,
    }


def phase_approx(out: str, kind: str, rows: int, params: dict) -> dict:
    from corag.retrieval.base import read_manifest
    from corag.retrieval.dense import ExactIndex, index_chunks
    from corag.retrieval.index import build_approx

    exact = ExactIndex(index_chunks(Path(out), read_manifest(Path(out), "dense")))
    queries = _query_vectors(exact, 200, 6)
    start = time.perf_counter()
    report = build_approx(out, kind, recall_queries=queries, k=20, **params)
    report["build_seconds"] = time.perf_counter() - start
    report["memory_share"] = report["bytes"] / report["exact_bytes"]
    return report


def phase_subset(source_out: str, rows: int, dim: int) -> dict:
    """A dense index of the first `rows` vectors of a bigger one (for the slower approximate kinds),
    over a corpus of as many placeholder passages."""
    import torch

    from corag.data.corpus import Corpus, prepare_corpus
    from corag.retrieval.base import read_manifest
    from corag.retrieval.dense import ExactIndex, index_chunks
    from corag.retrieval.index import import_embeddings

    work = Path(source_out).parent
    exact = ExactIndex(index_chunks(Path(source_out), read_manifest(Path(source_out), "dense")))
    (work / "subset-shards").mkdir(exist_ok=True)
    torch.save(
        torch.from_numpy(exact.vectors(np.arange(rows))).half(),
        work / "subset-shards" / "e5-large-shard-0.pt",
    )
    (work / "subset.jsonl").write_text('{"title": "", "contents": "-"}\n' * rows)
    corpus = Corpus(prepare_corpus(work / "subset.jsonl", work / "subset-store"))
    out = work / f"dense-{rows}"
    import_embeddings(corpus, out, work / "subset-shards", synthetic_encoder(dim))  # type: ignore[arg-type]
    return {"out": str(out)}


PHASES = {
    "generate": phase_generate,
    "prepare": phase_prepare,
    "lookup": phase_lookup,
    "lookup_in_memory": phase_lookup_in_memory,
    "bm25": phase_bm25,
    "bm25_baseline": phase_bm25_baseline,
    "bm25_search": phase_bm25_search,
    "shards": phase_shards,
    "dense_import": phase_dense_import,
    "dense_search": phase_dense_search,
    "approx": phase_approx,
    "subset": phase_subset,
}


def run(phase: str, *args) -> dict:
    """Run one phase in a fresh process; its last stdout line is its JSON result."""
    cmd = [sys.executable, __file__, "--phase", phase, json.dumps(list(args))]
    env = {**os.environ, "TQDM_DISABLE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"phase {phase} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{phase} {args[:2]}: {result}", flush=True)
    return result


def head_lines(source: Path, target: Path, lines: int) -> None:
    """The first `lines` lines of a file, copied in large blocks."""
    with open(source, "rb") as f, open(target, "wb") as g:
        left = lines
        while left:
            block = f.read(1 << 24)
            if not block:
                break
            count = block.count(b"\n")
            if count >= left:
                cut = -1
                for _ in range(left):
                    cut = block.index(b"\n", cut + 1)
                g.write(block[: cut + 1])
                break
            g.write(block)
            left -= count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes", default="1000000,5000000", help="corpus sizes (passages), the largest first is not needed"
    )
    ap.add_argument("--dense-rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--small-rows", type=int, default=100_000, help="rows for IVF-Flat and HNSW")
    ap.add_argument(
        "--workdir", default=None, help="folder for the generated data (default: a temporary one)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--phase", default=None, help=argparse.SUPPRESS)
    ap.add_argument("phase_args", nargs="?", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(PHASES[args.phase](*json.loads(args.phase_args))))
        return

    sizes = sorted(int(s) for s in args.sizes.split(","))
    small, big = sizes[0], sizes[-1]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="corag-corpus-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    out: dict[str, float | bool | str] = {}
    try:
        generated = run("generate", str(work / f"c{big}.jsonl"), big, 0)
        out[f"text_gib_{big // 10**6}m"] = generated["bytes"] / 2**30
        for n in sizes:
            if n != big:
                head_lines(work / f"c{big}.jsonl", work / f"c{n}.jsonl", n)
        for n in sizes:
            tag = f"{n // 10**6}m"
            prep = run("prepare", str(work / f"c{n}.jsonl"), str(work / f"s{n}"))
            look = run("lookup", str(work / f"s{n}"), n)
            out[f"prepare_seconds_{tag}"] = prep["seconds"]
            out[f"prepare_peak_rss_mb_{tag}"] = prep["peak_rss_mb"]
            out[f"store_gib_{tag}"] = prep["store_bytes"] / 2**30
            out[f"lookup_p50_ms_{tag}"] = look["p50_ms"]
            out[f"lookup_p99_ms_{tag}"] = look["p99_ms"]
            out[f"lookup_rss_growth_mb_{tag}"] = look["rss_growth_mb"]
        base = run("lookup_in_memory", str(work / f"c{small}.jsonl"), small)
        tag = f"{small // 10**6}m"
        out[f"in_memory_rss_gb_{tag}"] = base["load_rss_growth_mb"] / 1024
        out[f"lookup_p50_ratio_vs_in_memory_{tag}"] = out[f"lookup_p50_ms_{tag}"] / base["p50_ms"]
        for n in sizes:
            if n != big:
                os.remove(work / f"c{n}.jsonl")

        bm25 = run("bm25", str(work / f"s{small}"), str(work / "bm25"))
        bm25_base = run("bm25_baseline", str(work / f"s{small}"))
        bm25_search = run("bm25_search", str(work / "bm25"))
        out[f"bm25_build_seconds_{tag}"] = bm25["seconds"]
        out[f"bm25_peak_rss_gb_{tag}"] = bm25["peak_rss_mb"] / 1024
        out[f"bm25s_in_memory_peak_rss_gb_{tag}"] = bm25_base["peak_rss_mb"] / 1024
        out[f"bm25_peak_rss_ratio_vs_bm25s_{tag}"] = bm25["peak_rss_mb"] / bm25_base["peak_rss_mb"]
        out[f"bm25_index_gib_{tag}"] = bm25["index_bytes"] / 2**30
        out[f"bm25_qps_{tag}"] = bm25_search["qps"]
        out[f"bm25_search_rss_growth_mb_{tag}"] = bm25_search["search_rss_growth_mb"]
        out[f"bm25_search_private_growth_mb_{tag}"] = bm25_search["search_private_growth_mb"]

        rows, dim = args.dense_rows, args.dim
        store = work / f"s{rows}" if (work / f"s{rows}").exists() else work / f"s{small}"
        run("shards", str(work / "shards"), rows, dim)
        imp = run("dense_import", str(store), str(work / "shards"), str(work / "dense"), dim)
        shutil.rmtree(work / "shards")
        dense = run("dense_search", str(work / "dense"))
        out["dense_import_seconds_1m"] = imp["seconds"]
        out["dense_import_peak_rss_gb_1m"] = imp["peak_rss_mb"] / 1024
        out["dense_file_gib_1m"] = dense["file_bytes"] / 2**30
        out["dense_load_rss_growth_ratio"] = dense["load_rss_growth_ratio"]
        out["dense_search_rss_growth_mb"] = dense["search_rss_growth_mb"]
        out["dense_exact_cpu_seconds_256q_1m"] = dense["search_256_seconds"]
        pq = run(
            "approx",
            str(work / "dense"),
            "ivf-pq",
            rows,
            {"nlist": 1024, "pq_m": 64, "nprobe": 64, "rerank": 200, "train_size": 50_000},
        )
        out["approx_kind"] = f"{pq['factory']} nprobe {pq['nprobe']} rerank {pq['rerank']}"
        out["approx_recall_at_20"] = pq["recall@20"]
        out["approx_recall_at_20_without_rerank"] = pq["recall@20_without_rerank"]
        out["approx_memory_share"] = pq["memory_share"]
        out["approx_build_seconds_1m"] = pq["build_seconds"]
        sub = run("subset", str(work / "dense"), args.small_rows, dim)["out"]
        for kind, params in (
            ("ivf-flat", {"nlist": 256, "nprobe": 32, "rerank": 0}),
            ("hnsw", {"hnsw_m": 32, "ef_search": 128, "rerank": 0}),
        ):
            r = run("approx", sub, kind, args.small_rows, params)
            key = kind.replace("-", "_")
            out[f"{key}_recall_at_20_{args.small_rows // 1000}k"] = r["recall@20"]
            out[f"{key}_memory_share"] = r["memory_share"]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    # Extrapolation to the KILT corpus (35.7M passages, 1024-d E5 vectors).
    scale_big, scale_small = KILT / big, KILT / small
    out["kilt_prepare_minutes_est"] = out[f"prepare_seconds_{big // 10**6}m"] * scale_big / 60
    out["kilt_store_gib_est"] = out[f"store_gib_{big // 10**6}m"] * scale_big
    out["kilt_lookup_p50_ms_est"] = out[f"lookup_p50_ms_{big // 10**6}m"]  # O(k) reads: size does not enter
    out["kilt_bm25_index_gib_est"] = out[f"bm25_index_gib_{tag}"] * scale_small
    # The build's peak: one bucket (fixed) + 4 bytes of document length per passage + the vocabulary.
    out["kilt_bm25_peak_rss_gb_est"] = out[f"bm25_peak_rss_gb_{tag}"] + 4 * (KILT - small) / 2**30
    out["kilt_bm25_qps_est"] = out[f"bm25_qps_{tag}"] / scale_small
    out["kilt_dense_fp16_gib"] = KILT * 1024 * 2 / 2**30
    out["kilt_approx_gib_est"] = out["approx_memory_share"] * out["kilt_dense_fp16_gib"]
    out["kilt_exact_cpu_seconds_256q_est"] = out["dense_exact_cpu_seconds_256q_1m"] * KILT / rows
    big_tag = f"{big // 10**6}m"
    print(
        f"store: {big_tag} prepared in {out[f'prepare_seconds_{big_tag}']:.0f} s, lookup p50 "
        f"{out[f'lookup_p50_ms_{big_tag}']:.2f} ms, RSS +{out[f'lookup_rss_growth_mb_{big_tag}']:.1f} MB; "
        f"BM25 {tag} peak {out[f'bm25_peak_rss_gb_{tag}']:.2f} GB (bm25s {out[f'bm25s_in_memory_peak_rss_gb_{tag}']:.2f}); "
        f"dense load growth {100 * out['dense_load_rss_growth_ratio']:.2f}% of file; "
        f"IVF-PQ recall@20 {out['approx_recall_at_20']:.3f} at {100 * out['approx_memory_share']:.1f}% memory"
    )
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    main()
