"""Retrieval speed: exact dense search (blocks of rows) against one plain torch matmul + top-k, and the HTTP service
under concurrent single-query clients against one request at a time.

Run: python benchmarks/retrieval.py [--rows 100000] [--clients 16] [--requests 200]
The last printed line is one JSON object (ratios are measured against baselines in the same run).
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning: on a shared machine, spinning workers of faiss and
# torch steal the cores each other needs (seen here as a 10x slowdown at 2 threads). Set before the
# OpenMP runtimes load.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
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


def serve(rows: int, port: int, threads: int) -> None:
    """The service process: MiniLM query encoder over `rows` random 384-d passage vectors."""
    set_threads(threads)
    import uvicorn

    from corag.retrieval.dense import DenseRetriever, Encoder, ExactIndex
    from corag.retrieval.service import create_app

    index = ExactIndex([random_unit_vectors(rows, 0)])
    retriever = DenseRetriever(
        Encoder.from_preset("minilm", device="cpu"), index, [str(i) for i in range(rows)]
    )
    uvicorn.run(create_app(retriever), host="127.0.0.1", port=port, log_level="warning")


async def client_loop(http, url: str, client: int, requests: int, latencies: list[float]) -> int:
    errors = 0
    for i in range(requests):
        body = {"queries": [f"who directed the film number {client * requests + i} of the studio?"], "k": K}
        start = time.perf_counter()
        try:
            r = await http.post(f"{url}/search", json=body)
            ok = r.status_code == 200 and len(r.json()["hits"][0]) == K
        except Exception:
            ok = False
        latencies.append(time.perf_counter() - start)
        errors += not ok
    return errors


async def run_clients(url: str, clients: int, requests: int) -> tuple[float, list[float], int]:
    import httpx

    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        await client_loop(http, url, 0, 5, [])  # warm-up
        start = time.perf_counter()
        errors = await asyncio.gather(
            *(client_loop(http, url, c, requests, latencies) for c in range(clients))
        )
        elapsed = time.perf_counter() - start
    return clients * requests / elapsed, latencies, sum(errors)


def bench_service(rows: int, clients: int, requests: int, serial_requests: int, threads: int) -> dict:
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    # The service runs in its own process (this script with --serve-port), as it would in production.
    cmd = [
        sys.executable,
        __file__,
        "--serve-port",
        str(port),
        "--rows",
        str(rows),
        "--threads",
        str(threads),
    ]
    proc = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                httpx.get(f"{url}/health", timeout=2).raise_for_status()
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("service did not start") from None
                time.sleep(0.2)
        serial_rps, _, serial_errors = asyncio.run(run_clients(url, 1, serial_requests))
        rps, latencies, errors = asyncio.run(run_clients(url, clients, requests))
        health = httpx.get(f"{url}/health").json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    q = statistics.quantiles([lat * 1000 for lat in latencies], n=100)
    return {
        "service_errors": errors + serial_errors,
        "service_p50_ms": q[49],
        "service_p99_ms": q[98],
        "service_rps": rps,
        "serial_rps": serial_rps,
        "service_speedup_vs_serial": rps / serial_rps,
        "service_mean_batch": health["queries"] / max(health["searches"], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=16, help="search batches of 64 queries per pass")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=200, help="requests per concurrent client")
    ap.add_argument("--serial-requests", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1, help="torch and faiss threads, in both searches alike")
    ap.add_argument("--serve-port", type=int, default=None, help=argparse.SUPPRESS)  # the service process
    args = ap.parse_args()
    if args.serve_port is not None:
        serve(args.rows, args.serve_port, args.threads)
        return

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    set_threads(args.threads)
    result = bench_search(args.rows, args.batches, args.repeats)
    print(
        f"exact search, {args.rows} x {DIM}, batch {BATCH}, top-{K}: "
        f"ours {result['search_qps']:.0f} q/s, torch {result['torch_qps']:.0f} q/s"
    )
    result |= bench_service(args.rows, args.clients, args.requests, args.serial_requests, args.threads)
    print(
        f"service: {args.clients} clients x {args.requests} requests: {result['service_rps']:.0f} req/s "
        f"(serial {result['serial_rps']:.0f} req/s), p50 {result['service_p50_ms']:.1f} ms, "
        f"p99 {result['service_p99_ms']:.1f} ms, mean batch {result['service_mean_batch']:.1f}"
    )
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
