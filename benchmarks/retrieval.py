"""Exact dense search speed: corag's blocked search (ExactIndex) against one plain torch matmul + top-k,
with the same ids. The HTTP retrieval service under concurrent clients is measured by benchmarks/engine.py.

Run: python benchmarks/retrieval.py [--rows 100000] [--batches 16] [--threads 1]
The last printed line is one JSON object (ratios are measured against baselines in the same run).
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning: on a shared machine, spinning workers of faiss and
# torch steal the cores each other needs (seen here as a 10x slowdown at 2 threads). Set before the
# OpenMP runtimes load.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

DIM, K, BATCH = 384, 10, 64


def random_unit_vectors(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def set_threads(n: int) -> None:
    import faiss
    import torch

    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)


def best_qps(searches: dict, batches: list[np.ndarray], repeats: int) -> tuple[dict, dict]:
    """Queries per second of each search: the fastest of `repeats` passes over all batches, the
    searches taking turns pass by pass so that load from other processes hits them alike."""
    out = {name: [search(b) for b in batches[:2]] for name, search in searches.items()}  # warm-up
    best = dict.fromkeys(searches, float("inf"))
    for _ in range(repeats):
        for name, search in searches.items():
            start = time.perf_counter()
            out[name] = [search(b) for b in batches]
            best[name] = min(best[name], time.perf_counter() - start)
    n = sum(len(b) for b in batches)
    return {name: n / t for name, t in best.items()}, out


def tie_order(scores: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Ids of each row ordered by descending score, then ascending id: exactly tied scores (which
    random data does produce) may come back in either order from either search."""
    order = np.lexsort((ids, -scores), axis=1)
    return np.take_along_axis(ids, order, axis=1)


def bench_search(rows: int, num_batches: int, repeats: int) -> dict:
    import torch

    from corag.retrieval.dense import ExactIndex

    x = random_unit_vectors(rows, 0)
    queries = random_unit_vectors(BATCH * num_batches, 1)
    batches = [queries[i : i + BATCH] for i in range(0, len(queries), BATCH)]

    index = ExactIndex([x])
    xt = torch.from_numpy(x)

    @torch.inference_mode()
    def torch_search(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        scores, ids = (torch.from_numpy(q) @ xt.T).topk(K, dim=1)
        return scores.numpy(), ids.numpy()

    qps, out = best_qps({"ours": lambda q: index.search(q, K), "torch": torch_search}, batches, repeats)
    same = all(
        np.array_equal(tie_order(*a), tie_order(*b)) for a, b in zip(out["ours"], out["torch"], strict=True)
    )
    return {
        "search_qps": qps["ours"],
        "torch_qps": qps["torch"],
        "search_speedup_vs_torch": qps["ours"] / qps["torch"],
        "same_ids": same,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=16, help="search batches of 64 queries per pass")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch and faiss threads, in both searches alike")
    args = ap.parse_args()
    set_threads(args.threads)
    result = bench_search(args.rows, args.batches, args.repeats)
    print(
        f"exact search, {args.rows} x {DIM}, batch {BATCH}, top-{K}: "
        f"ours {result['search_qps']:.0f} q/s, torch {result['torch_qps']:.0f} q/s"
    )
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
