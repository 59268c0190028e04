"""The cluster path's throughput: the retrieval service under concurrent clients, and identical requests
computed once by the executor.

service: `corag serve-retriever`'s app in its own process over a dense index (MiniLM queries, `--rows`
random 384-d passage vectors, exact search; one torch thread) on 127.0.0.1. `--clients` concurrent
clients, each sending one query per request on the official E5 API (`POST /` {"query"}) or ours
(`POST /search`), against one client sending the same number of requests one after another, in
`--rounds` turns. Reports the median round's requests/s and speed-up (`service_speedup_vs_serial`, the
target is >= 3) with every round's, p50/p99 latency, the mean coalesced batch and errors. On a CPU
the ratio is bounded by arithmetic: encoding and exact search cost ~14 and ~13 ms for one query and
~35 and ~29 ms for eight (one thread), where a GPU searches eight for about the price of one.

dedup: sampling on the toy world (tiny Llama, BM25, transformers backend) with the executor's
identical-request reuse on and off: the share of prompt tokens it saves (`dedup_saved_share`) and
whether the records are identical (`dedup_identical`).

async: greedy decoding (L=3) of the same questions with the stepped executor and the asyncio one
(corag.executor): questions/s (`async_speedup`) and identical predictions (`async_identical`).
With `--backend hf` both run on the transformers backend; with `--backend vllm` (where vLLM is
installed: tests/vllm/run.sh builds such an environment on CPU) the stepped executor drives vLLM's
offline engine in lock-step waves and the asyncio one its asynchronous engine (`vllm-async`), whose
running batch each call joins as it comes.

Run: python benchmarks/engine.py [--parts service,dedup,async] [--backend hf|vllm] [--clients 16]
Only loopback traffic; every loop is bounded. The last printed line is one JSON object.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads sleep on a shared machine

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

DIM, K = 384, 5


def serve(rows: int, port: int, max_wait_ms: float, threads: int) -> None:
    """The service process: MiniLM query encoder over `rows` random unit vectors."""
    import torch
    import uvicorn

    from corag.retrieval.dense import DenseRetriever, Encoder, ExactIndex
    from corag.retrieval.service import create_app

    torch.set_num_threads(threads)
    x = np.random.default_rng(0).standard_normal((rows, DIM), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    retriever = DenseRetriever(
        Encoder.from_preset("minilm", device="cpu"), ExactIndex([x]), [str(i) for i in range(rows)]
    )
    app = create_app(retriever, max_wait_ms=max_wait_ms, official_k=K)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


async def client_loop(
    http: Any, url: str, api: str, client: int, requests: int, latencies: list[float]
) -> int:
    """One client's requests, one after another; returns how many failed."""
    errors = 0
    for i in range(requests):
        query = f"who directed the film number {client * requests + i} of the studio?"
        start = time.perf_counter()
        try:
            if api == "official":
                r = await http.post(f"{url}/", json={"query": query})
                ok = r.status_code == 200 and len(r.json()) == K
            else:
                r = await http.post(f"{url}/search", json={"queries": [query], "k": K})
                ok = r.status_code == 200 and len(r.json()["hits"][0]) == K
        except Exception:
            ok = False
        latencies.append(time.perf_counter() - start)
        errors += not ok
    return errors


async def run_clients(url: str, api: str, clients: int, requests: int) -> tuple[float, list[float], int]:
    import httpx

    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        await client_loop(http, url, api, 0, 3, [])  # warm-up
        start = time.perf_counter()
        errors = await asyncio.gather(
            *(client_loop(http, url, api, c, requests, latencies) for c in range(clients))
        )
        elapsed = time.perf_counter() - start
    return clients * requests / elapsed, latencies, sum(errors)


def bench_service(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        __file__,
        "--serve-port",
        str(port),
        "--rows",
        str(args.rows),
        "--max-wait-ms",
        str(args.max_wait_ms),
        "--threads",
        str(args.threads),
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
        total = args.clients * args.requests
        rounds, latencies, errors, queries, searches = [], [], 0, 0, 0
        for _ in range(args.rounds):  # serial and concurrent take turns, so load from elsewhere hits both
            serial_rps, _, serial_errors = asyncio.run(run_clients(url, args.api, 1, total))
            before = httpx.get(f"{url}/health").json()
            rps, lat, errs = asyncio.run(run_clients(url, args.api, args.clients, args.requests))
            after = httpx.get(f"{url}/health").json()
            rounds.append((rps, serial_rps))
            latencies += lat
            errors += errs + serial_errors
            queries += after["queries"] - before["queries"]
            searches += after["searches"] - before["searches"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    q = statistics.quantiles([lat * 1000 for lat in latencies], n=100)
    rps, serial_rps = sorted(rounds, key=lambda r: r[0] / r[1])[(len(rounds) - 1) // 2]  # the median round
    return {
        "service_api": args.api,
        "service_clients": args.clients,
        "service_requests": total * args.rounds,
        "service_errors": errors,
        "service_rps": rps,
        "serial_rps": serial_rps,
        "service_speedup_vs_serial": rps / serial_rps,
        "service_speedup_rounds": [round(a / b, 2) for a, b in rounds],
        "service_p50_ms": q[49],
        "service_p99_ms": q[98],
        "service_mean_batch": queries / max(searches, 1),
    }


def toy_setup(vllm: bool) -> dict[str, Any]:
    """The tiny Llama (taught to end its turns; heads of 64, as vLLM's CPU kernels need) on the
    transformers backend (and with `vllm`, on vLLM's offline and asynchronous engines), BM25 and
    corpus of a toy world, and its questions."""
    import torch

    from corag.data.corpus import Corpus
    from corag.lm import load_lm
    from corag.toy.tinymodel import build_tiny_model, save_tiny, teach_turn_ends, train_tokenizer
    from corag.toy.world import generate_world, tokenizer_texts

    torch.set_num_threads(1)
    world = generate_world(seed=0, num_entities=120, num_distractors=30, train_per_hop=10, test_per_hop=20)
    folder = Path(tempfile.mkdtemp(prefix="corag-bench-engine-"))
    world.write(folder / "world")
    tokenizer = train_tokenizer(tokenizer_texts(world))
    model = build_tiny_model(tokenizer, seed=0)
    teach_turn_ends(model, tokenizer, world, 30)
    path = save_tiny(folder / "model", model, tokenizer)
    lms = {"hf": load_lm(path, backend="hf", device="cpu")}
    if vllm:  # float32 and eager on CPU; before bm25s loads llvmlite, which vLLM's CPU start-up trips on
        for backend in ("vllm", "vllm-async"):
            lms[backend] = load_lm(path, backend, dtype="float32", enforce_eager=True)
    from corag.retrieval.bm25 import BM25Retriever

    corpus = Corpus.load(folder / "world" / "corpus.jsonl")
    retriever = BM25Retriever.from_passages(world.passages)
    return {"lms": lms, "retriever": retriever, "corpus": corpus, "world": world, "folder": folder}


def bench_dedup(args: argparse.Namespace, setup: tuple) -> dict[str, Any]:
    """Sampling with identical requests computed once, against every request computed."""
    from corag.lm.base import WrappedLM
    from corag.sampling import SamplingConfig, run_sampling

    class PromptTokens(WrappedLM):
        """Counts the prompt tokens the backend actually computes."""

        def __init__(self, lm: Any) -> None:
            super().__init__(lm)
            self.tokens = 0

        def generate(self, requests):
            self.tokens += sum(self.lm.count_prompt_tokens(r.messages) for r in requests)
            return self.lm.generate(requests)

        def score(self, requests):
            self.tokens += sum(self.lm.count_score_tokens(r) for r in requests)
            return self.lm.score(requests)

    base, retriever, corpus = setup["lms"]["hf"], setup["retriever"], setup["corpus"]
    world, folder = setup["world"], setup["folder"]
    questions = world.train[: args.dedup_questions]
    config = SamplingConfig(num_chains=4, max_length=3, temperature=0.7)
    out: dict[bool, tuple[int, bytes]] = {}
    for dedup in (False, True):
        lm = PromptTokens(base)
        path = folder / f"chains-{dedup}.jsonl"
        run_sampling(
            questions, corpus, lm, retriever, config, path, block_size=16, progress=False, dedup=dedup
        )
        out[dedup] = (lm.tokens, path.read_bytes())
    return {
        "dedup_questions": len(questions),
        "dedup_prompt_tokens": out[True][0],
        "prompt_tokens_without_dedup": out[False][0],
        "dedup_saved_share": 1 - out[True][0] / out[False][0],
        "dedup_identical": out[True][1] == out[False][1],
    }


def bench_async(args: argparse.Namespace, setup: tuple) -> dict[str, Any]:
    """Greedy decoding (L=3) of the same questions with the stepped and the asyncio executor."""
    from corag.decoding import STRATEGIES
    from corag.executor import AsyncExecutor, Executor

    retriever, corpus, world = setup["retriever"], setup["corpus"], setup["world"]
    loaded = setup["lms"]
    lms = {"stepped": loaded["hf"], "async": loaded["hf"]}
    if args.backend == "vllm":
        lms = {"stepped": loaded["vllm"], "async": loaded["vllm-async"]}
    questions = world.test[: args.async_questions]
    timings, outputs = {}, {}
    for name, cls in (("stepped", Executor), ("async", AsyncExecutor), ("stepped_again", Executor)):
        executor = cls(lms[name.removesuffix("_again")], retriever, dedup=False)
        start = time.perf_counter()
        results = executor.run(
            [STRATEGIES["greedy"](executor.context(), q, corpus, max_steps=3) for q in questions]
        )
        timings[name] = time.perf_counter() - start
        outputs[name] = [(r.steps, r.prediction) for r in results]
    stepped = min(timings["stepped"], timings["stepped_again"])  # the better of two, around the async run
    if args.backend == "vllm":
        lms["async"].close()
    return {
        "async_backend": args.backend,
        "async_questions": len(questions),
        "async_qps": len(questions) / timings["async"],
        "stepped_qps": len(questions) / stepped,
        "async_speedup": stepped / timings["async"],
        "async_identical": outputs["async"] == outputs["stepped"] == outputs["stepped_again"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="service,dedup,async", help="comma-separated: service, dedup, async")
    ap.add_argument("--async-questions", type=int, default=32)
    ap.add_argument("--backend", choices=("hf", "vllm"), default="hf", help="backend of the async part")
    ap.add_argument("--rows", type=int, default=100_000, help="passage vectors of the service's index")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=40, help="requests per concurrent client")
    ap.add_argument("--rounds", type=int, default=3, help="serial and concurrent runs, taking turns")
    ap.add_argument("--api", choices=("official", "corag"), default="official")
    ap.add_argument("--max-wait-ms", type=float, default=5.0, help="the service's longest coalescing wait")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of the service process (the clients share the machine)",
    )
    ap.add_argument("--dedup-questions", type=int, default=32)
    ap.add_argument("--serve-port", type=int, default=None, help=argparse.SUPPRESS)  # the service process
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.serve_port is not None:
        serve(args.rows, args.serve_port, args.max_wait_ms, args.threads)
        return
    parts = set(args.parts.split(","))
    result: dict[str, Any] = {}
    if "service" in parts:
        result |= bench_service(args)
        print(
            f"service ({args.api} API): {args.clients} clients: {result['service_rps']:.1f} req/s, serial "
            f"{result['serial_rps']:.1f} req/s, speed-up {result['service_speedup_vs_serial']:.2f}x, p50 "
            f"{result['service_p50_ms']:.0f} ms, p99 {result['service_p99_ms']:.0f} ms, mean batch "
            f"{result['service_mean_batch']:.1f}, errors {result['service_errors']}"
        )
    setup = toy_setup("async" in parts and args.backend == "vllm") if parts & {"dedup", "async"} else {}
    if "async" in parts:
        result |= bench_async(args, setup)
        print(
            f"async: {result['async_qps']:.2f} q/s against stepped {result['stepped_qps']:.2f} q/s, "
            f"{result['async_speedup']:.2f}x, identical {result['async_identical']}"
        )
    if "dedup" in parts:
        result |= bench_dedup(args, setup)
        print(
            f"dedup: {result['dedup_saved_share']:.1%} of prompt tokens saved, identical "
            f"{result['dedup_identical']}"
        )
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
