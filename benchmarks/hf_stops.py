"""Stop strings in the transformers backend: what looking for them costs per generated token.

32 sampled sequences of 256 new tokens on a one-layer tiny Llama (CPU, torch on one thread), with two
stop strings that never occur, against the same requests without stop strings. Stop strings are looked
for in a window of the newest tokens, so the cost should stay flat in the length of the text
(`stop_overhead` near 1; decoding the whole text at every step made it grow with the square of the
length). Also checks that both give identical texts up to the stop. The last line is JSON.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import torch

from corag.lm.base import GenerationRequest
from corag.lm.hf import HFLM
from corag.toy.tinymodel import build_tiny_model, train_tokenizer

TEXTS = [f"The director of film {i} is person {i * 7 % 13}, born in city {i % 5}." for i in range(200)]


def timed(lm: HFLM, requests: list[GenerationRequest], repeats: int = 2) -> tuple[float, list]:
    best, out = float("inf"), []
    for _ in range(repeats):
        start = time.process_time()
        out = lm.generate(requests)
        best = min(best, time.process_time() - start)
    return best, out


def main() -> None:
    torch.set_num_threads(1)
    tokenizer = train_tokenizer(TEXTS, vocab_size=400)
    model = build_tiny_model(tokenizer, hidden_size=64, num_heads=1, intermediate_size=128, num_layers=1)
    lm = HFLM(model, tokenizer, batch_size=32)
    lm.end_ids = frozenset()  # no end of turn: every sequence runs to its length
    plain = [
        GenerationRequest(({"role": "user", "content": t},), max_new_tokens=256, temperature=1.0, seed=i)
        for i, t in enumerate(TEXTS[:32])
    ]
    stopped = [replace(r, stop=("\x00never", "zz-never")) for r in plain]
    base_s, base = timed(lm, plain)
    stop_s, out = timed(lm, stopped)
    tokens = sum(c.usage.completion_tokens for c in out)
    print(f"without stop strings {base_s:.2f} s, with {stop_s:.2f} s CPU for {tokens} new tokens")
    print(
        json.dumps(
            {
                "new_tokens": tokens,
                "cpu_s_without_stops": round(base_s, 3),
                "cpu_s_with_stops": round(stop_s, 3),
                "stop_overhead": round(stop_s / base_s, 3),
                "identical": [c.texts for c in out] == [c.texts for c in base],
            }
        )
    )


if __name__ == "__main__":
    main()
