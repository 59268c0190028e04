"""Retrieval speed: exact dense search against a plain torch matmul + top-k, and the HTTP service
under concurrent single-query clients against one request at a time.

Run: python benchmarks/retrieval.py [--rows 100000] [--clients 16] [--requests 200]
The last printed line is one JSON object (ratios are measured against baselines in the same run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import time

import numpy as np

DIM, K, BATCH = 384, 10, 64


def random_unit_vectors(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def set_threads(n: int) -> None:
    import faiss
    import torch

    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)


def best_qps(search, batches: list[np.ndarray], repeats: int) -> tuple[float, list[np.ndarray]]:
    """Queries per second of the fastest of `repeats` passes over all batches (after one warm-up)."""
    out = [search(b) for b in batches[:2]]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = [search(b) for b in batches]
        best = min(best, time.perf_counter() - start)
    return sum(len(b) for b in batches) / best, out


def bench_search(rows: int, num_batches: int, repeats: int) -> dict:
    import torch

    from corag.retrieval.dense import FaissIndex

    x = random_unit_vectors(rows, 0)
    queries = random_unit_vectors(BATCH * num_batches, 1)
    batches = [queries[i : i + BATCH] for i in range(0, len(queries), BATCH)]

    index = FaissIndex.empty(DIM)
    index.add(x)
    ours_qps, ours = best_qps(lambda q: index.search(q, K)[1], batches, repeats)

    xt = torch.from_numpy(x)

    @torch.inference_mode()
    def torch_search(q: np.ndarray) -> np.ndarray:
        return (torch.from_numpy(q) @ xt.T).topk(K, dim=1).indices.numpy()

    torch_qps, theirs = best_qps(torch_search, batches, repeats)
    same = all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
    return {
        "search_qps": ours_qps,
        "torch_qps": torch_qps,
        "search_speedup_vs_torch": ours_qps / torch_qps,
        "same_ids": same,
    }


def serve(rows: int, port: int, threads: int) -> None:
    """The service process: MiniLM query encoder over `rows` random 384-d passage vectors."""
    set_threads(threads)
    import uvicorn

    from corag.retrieval.dense import DenseRetriever, Encoder, FaissIndex
    from corag.retrieval.service import create_app

    index = FaissIndex.empty(DIM)
    index.add(random_unit_vectors(rows, 0))
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
    proc = mp.get_context("spawn").Process(target=serve, args=(rows, port, threads), daemon=True)
    proc.start()
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                httpx.get(f"{url}/health", timeout=2).raise_for_status()
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or not proc.is_alive():
                    raise RuntimeError("service did not start") from None
                time.sleep(0.2)
        serial_rps, _, serial_errors = asyncio.run(run_clients(url, 1, serial_requests))
        rps, latencies, errors = asyncio.run(run_clients(url, clients, requests))
        health = httpx.get(f"{url}/health").json()
    finally:
        proc.terminate()
        proc.join(timeout=10)
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
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=200, help="requests per concurrent client")
    ap.add_argument("--serial-requests", type=int, default=200)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

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
