"""vLLM and transformers backends agree on the real checkpoint (SmolLM2-135M-Instruct, ChatML): prompt token
counts, greedy texts that end at its end-of-turn token or at the cap, and target log-probabilities.

Runs where vllm is installed (tests/vllm/run.sh runs it in its own process, after the tiny-model file);
skipped elsewhere. Both backends compute in float32, so they agree up to kernel rounding.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
pytest.importorskip("vllm")

from corag.lm import load_lm  # noqa: E402
from corag.lm.base import GenerationRequest, ScoreRequest  # noqa: E402
from corag.lm.hf import HFLM  # noqa: E402
from corag.lm.vllm import VLLMLM  # noqa: E402
from corag.prompts import subanswer_messages, subquery_messages  # noqa: E402
from corag.types import Passage, Step  # noqa: E402


def chat(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


DOCS = [
    Passage("0", "Ed Wood", "Edward Davis Wood Jr. was an American filmmaker, actor, writer and producer."),
    Passage("1", "Scott Derrickson", "Scott Derrickson is an American director, screenwriter and producer."),
]
QUERY = "Were Scott Derrickson and Ed Wood of the same nationality?"
PROMPTS = [
    chat("What is the capital of France?"),
    ({"role": "system", "content": "Answer in one word."}, *chat("What colour is the sky on a clear day?")),
    tuple(subquery_messages(QUERY, [Step("What is the nationality of Ed Wood?", "American")], "answer")),
    tuple(subanswer_messages("What is the nationality of Scott Derrickson?", DOCS)),
    chat("Write a long story about a dragon."),
]


@pytest.fixture(scope="module")
def hf(smollm2_dir) -> HFLM:
    return HFLM(smollm2_dir, device="cpu", batch_size=8)


@pytest.fixture(scope="module")
def vllm_lm(smollm2_dir) -> VLLMLM:
    lm = load_lm(smollm2_dir, backend="vllm", dtype="float32", enforce_eager=True)
    assert isinstance(lm, VLLMLM)
    return lm


def test_context_and_counts_agree(hf: HFLM, vllm_lm: VLLMLM) -> None:
    assert vllm_lm.max_context == hf.max_context
    assert vllm_lm.end_ids == sorted(hf.end_ids)
    for messages in PROMPTS:
        assert vllm_lm.count_prompt_tokens(messages) == hf.count_prompt_tokens(messages)


def test_greedy_generations_are_identical(hf: HFLM, vllm_lm: VLLMLM) -> None:
    requests = [GenerationRequest(m, max_new_tokens=24) for m in PROMPTS]
    ours, theirs = hf.generate(requests), vllm_lm.generate(requests)
    ended = [c.usage.completion_tokens < 24 for c in ours]
    assert any(ended) and not all(ended), "the prompts should cover both ways of stopping"
    assert theirs == ours


def test_scores_are_identical(hf: HFLM, vllm_lm: VLLMLM) -> None:
    targets = [
        "Paris",
        "Blue",
        "What is the nationality of Scott Derrickson?",
        "American",
        "Once upon a time",
    ]
    requests = [ScoreRequest(m, t) for m, t in zip(PROMPTS, targets, strict=True)]
    for a, b in zip(hf.score(requests), vllm_lm.score(requests), strict=True):
        assert b.usage == a.usage
        assert b.logprobs == pytest.approx(a.logprobs, abs=2e-3)
