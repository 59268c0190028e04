"""GPU figures in one run (torch and the transformers backend only; vLLM is not needed):

1. decoding: the transformers backend's executor (all questions' calls batched) against one question at
   a time, greedy L=3 on toy-world questions with BM25, on a random-weight Llama built from the
   Llama-3.2-1B config (bf16). Random weights never end a turn, so every call runs to its token limit:
   both sides do the same work. Reports questions/s, the speed-up (target >= 8) and identical outputs.
2. search: exact fp16 inner-product search (corag's TorchIndex) over 35.7M x 1024 random unit vectors
   (the KILT corpus's E5 index: 73 GB, one H100 or H200),
   queries/s at batch 256, against one plain matmul + top-k over the same matrix.
3. training: one bf16 SFT step (AdamW, full fine-tuning, sequences of 2048 tokens) of that model:
   tokens/s and MFU against the GPU's dense bf16 peak (`--peak-tflops`, H100/H200 SXM: 989).

Run: bash benchmarks/gpu.sh (the one-GPU smoke, then the search part; python benchmarks/gpu.py --small on
a CPU checks this script). The last printed line is one JSON object; with `--smoke smoke.json` it also holds
that smoke's stages (status, wall time, rates, peak memory and its ratio to the plan).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

# Llama-3.2-1B's published architecture (config.json of meta-llama/Llama-3.2-1B).
LLAMA_1B = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    vocab_size=128256,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    tie_word_embeddings=True,
)
SMALL = dict(LLAMA_1B, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=2, vocab_size=4096)  # fmt: skip


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def random_llama(tokenizer: Any, sizes: dict, device: str) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = max(sizes["vocab_size"], max(tokenizer.get_vocab().values()) + 1)
    config = LlamaConfig(
        **{**sizes, "vocab_size": vocab},
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(torch.bfloat16 if device == "cuda" else torch.float32).eval()


def bench_decoding(model: Any, tokenizer: Any, args: argparse.Namespace) -> dict:
    from corag.data.corpus import Corpus
    from corag.decoding import STRATEGIES
    from corag.executor import Executor
    from corag.lm.hf import HFLM
    from corag.retrieval.bm25 import BM25Retriever
    from corag.toy.world import generate_world

    world = generate_world(seed=0, num_entities=160, num_distractors=40, train_per_hop=10, test_per_hop=30)
    folder = Path(tempfile.mkdtemp(prefix="corag-gpu-"))
    world.write(folder / "world")
    corpus = Corpus.load(folder / "world" / "corpus.jsonl")
    retriever = BM25Retriever.from_passages(world.passages)
    lm = HFLM(model, tokenizer, batch_size=args.batch_size, max_batch_tokens=None, max_context=4096)
    questions = world.test[: args.questions]
    strategy = STRATEGIES["greedy"]

    def run(items: list, max_active: int) -> tuple[list, float]:
        executor = Executor(lm, retriever, max_active=max_active)
        sync()
        start = time.perf_counter()
        out = executor.run([strategy(executor.context(), q, corpus, max_steps=3) for q in items])
        sync()
        return out, time.perf_counter() - start

    run(questions[:2], 2)  # warm-up
    batched, wall_b = run(questions, 256)
    baseline = questions[: args.baseline_questions]
    single, wall_s = run(baseline, 1)
    qps_b, qps_s = len(questions) / wall_b, len(baseline) / wall_s
    same = [(r.steps, r.prediction) for r in batched[: len(baseline)]] == [
        (r.steps, r.prediction) for r in single
    ]
    return {
        "decode_questions": len(questions),
        "decode_baseline_questions": len(baseline),
        "decode_qps": qps_b,
        "decode_qps_one_at_a_time": qps_s,
        "decode_speedup": qps_b / qps_s,
        "decode_identical": same,
    }


@torch.inference_mode()
def bench_search(args: argparse.Namespace, device: str) -> dict:
    from corag.retrieval.dense import TorchIndex

    rows, dim, batch, k = args.rows, 1024, 256, 20
    dtype = torch.float16 if device == "cuda" else torch.float32
    matrix = torch.empty((rows, dim), dtype=dtype, device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    for start in range(0, rows, 1 << 20):  # filled in blocks: fp32 scratch stays small
        block = torch.randn((min(1 << 20, rows - start), dim), generator=gen, device=device)
        matrix[start : start + len(block)] = torch.nn.functional.normalize(block, dim=1).to(dtype)
    index = TorchIndex([matrix], block_rows=args.block_rows)
    queries = torch.nn.functional.normalize(torch.randn((batch * args.search_batches, dim)), dim=1).numpy()
    batches = [queries[i : i + batch] for i in range(0, len(queries), batch)]

    def plain(q: Any) -> tuple[Any, Any]:
        s, i = (torch.from_numpy(q).to(device, dtype) @ matrix.T).float().topk(k, dim=1)
        return s.cpu().numpy(), i.cpu().numpy()

    timings = {}
    results = {}
    for name, search in (("ours", lambda q: index.search(q, k)), ("plain", plain)):
        search(batches[0])  # warm-up
        sync()
        start = time.perf_counter()
        results[name] = [search(b) for b in batches]
        sync()
        timings[name] = time.perf_counter() - start
    same = all(
        (a[1][:, 0] == b[1][:, 0]).all() for a, b in zip(results["ours"], results["plain"], strict=True)
    )
    n = batch * len(batches)
    return {
        "search_rows": rows,
        "search_batch": batch,
        "search_qps": n / timings["ours"],
        "search_qps_plain_matmul": n / timings["plain"],
        "search_same_top1": bool(same),
    }


def bench_training(model: Any, args: argparse.Namespace, device: str) -> dict:
    model.train()
    model.to(torch.bfloat16 if device == "cuda" else torch.float32)
    model.gradient_checkpointing_disable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device == "cuda")
    vocab = model.config.vocab_size
    seq, micro = args.seq_len, args.micro_batch
    ids = torch.randint(
        0, vocab, (micro, seq), device=device, generator=torch.Generator(device).manual_seed(0)
    )

    def step() -> float:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    for _ in range(2):  # warm-up: allocator, kernels, optimizer state
        step()
    sync()
    start = time.perf_counter()
    for _ in range(args.train_steps):
        step()
    sync()
    seconds = (time.perf_counter() - start) / args.train_steps
    params = sum(p.numel() for p in model.parameters())
    cfg = model.config
    # 6 N per token for the dense layers plus causal attention's 6 * layers * seq * width (fwd+bwd, halved).
    flops_per_token = 6 * params + 6 * cfg.num_hidden_layers * seq * cfg.num_attention_heads * cfg.head_dim
    tokens = micro * seq
    achieved = flops_per_token * tokens / seconds
    return {
        "train_params": params,
        "train_tokens_per_step": tokens,
        "train_step_s": seconds,
        "train_tokens_per_s": tokens / seconds,
        "train_tflops": achieved / 1e12,
        "train_mfu": achieved / (args.peak_tflops * 1e12),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="decoding,search,training")
    ap.add_argument("--small", action="store_true", help="tiny sizes, to check the script on a CPU")
    ap.add_argument("--questions", type=int, default=128)
    ap.add_argument("--baseline-questions", type=int, default=16, help="questions run one at a time")
    ap.add_argument("--batch-size", type=int, default=128, help="sequences per forward pass (executor)")
    ap.add_argument("--rows", type=int, default=35_700_000, help="vectors searched (KILT: 35.7M)")
    ap.add_argument("--block-rows", type=int, default=1 << 21)
    ap.add_argument("--search-batches", type=int, default=20)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--train-steps", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU")
    ap.add_argument("--smoke", help="a smoke.json whose stages go into the last line")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = LLAMA_1B
    if args.small:
        sizes = SMALL
        args.questions, args.baseline_questions, args.rows, args.search_batches = 4, 2, 20_000, 2
        args.block_rows, args.seq_len, args.micro_batch, args.train_steps = 8192, 128, 2, 1
    print(f"device {device}: {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}", flush=True)

    from corag.toy.tinymodel import train_tokenizer
    from corag.toy.world import generate_world, tokenizer_texts

    tokenizer = train_tokenizer(tokenizer_texts(generate_world(seed=0, num_entities=160, num_distractors=40)))
    parts = set(args.parts.split(","))
    result: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    model = random_llama(tokenizer, sizes, device) if parts & {"decoding", "training"} else None
    if "decoding" in parts:
        result |= bench_decoding(model, tokenizer, args)
        print(
            f"decoding: {result['decode_speedup']:.1f}x, identical {result['decode_identical']}", flush=True
        )
    if "search" in parts:
        result |= bench_search(args, device)
        print(f"search: {result['search_qps']:.0f} q/s at batch 256 over {args.rows} rows", flush=True)
    if "training" in parts:
        result |= bench_training(model, args, device)
        print(
            f"training: MFU {result['train_mfu']:.1%}, {result['train_tokens_per_s']:.0f} tokens/s",
            flush=True,
        )
    if args.smoke and Path(args.smoke).is_file():
        for stage in json.loads(Path(args.smoke).read_text())["stages"]:
            keep = ("status", "seconds", "ratio")
            result[f"smoke_{stage['name']}"] = {k: stage[k] for k in keep} | stage["rates"] | stage["memory"]
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
