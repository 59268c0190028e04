"""Chain scores do not depend on prefix caching. Prefix caching is on in the shipped configs, and vLLM's
prompt_logprobs have been reported to change with request order when it is (vllm-project/vllm#42019):
rejection sampling's chain scores from an engine with it (cold, warm, in reverse order) and from one
without it equal the transformers scores of SmolLM2-135M-Instruct.

tests/vllm/run.sh runs each test in its own process (one in-process engine per process).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
pytest.importorskip("vllm")

from corag.lm import load_lm  # noqa: E402
from corag.lm.base import ScoreRequest  # noqa: E402
from corag.lm.hf import HFLM  # noqa: E402
from corag.prompts import final_answer_messages  # noqa: E402
from corag.types import Step  # noqa: E402

QUERY = "Were Scott Derrickson and Ed Wood of the same nationality?"


def chain_scores() -> list[ScoreRequest]:
    """The gold answer after call C without documents, for the prefixes of two chains of one question
    (so the prompts share long prefixes: what prefix caching reuses)."""
    chains = [
        [Step("What is the nationality of Scott Derrickson?", "American"),
         Step("What is the nationality of Ed Wood?", "American")],
        [Step("Who is Scott Derrickson?", "An American director"),
         Step("Who was Ed Wood?", "An American filmmaker")],
    ]  # fmt: skip
    return [
        ScoreRequest(tuple(final_answer_messages(QUERY, chain[:n], "answer multi-hop questions", [])), "yes")
        for chain in chains
        for n in (0, 1, 2)
    ]


@pytest.fixture(scope="module")
def reference(smollm2_dir):
    return HFLM(smollm2_dir, device="cpu", batch_size=8).score(chain_scores())


def engine(smollm2_dir, caching: bool):
    return load_lm(
        smollm2_dir, backend="vllm", dtype="float32", enforce_eager=True, enable_prefix_caching=caching
    )


def assert_same(scores, reference) -> None:
    for ours, theirs in zip(reference, scores, strict=True):
        assert theirs.usage == ours.usage
        assert theirs.logprobs == pytest.approx(ours.logprobs, abs=2e-3)


def test_with_prefix_caching_cold_warm_and_reversed(smollm2_dir, reference) -> None:
    lm, requests = engine(smollm2_dir, caching=True), chain_scores()
    cold = lm.score(requests)
    warm = lm.score(requests)  # every prefix is cached now
    backwards = lm.score(requests[::-1])[::-1]
    for scores in (cold, warm, backwards):
        assert_same(scores, reference)
    for a, b in zip(cold, warm, strict=True):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)


def test_without_prefix_caching(smollm2_dir, reference) -> None:
    assert_same(engine(smollm2_dir, caching=False).score(chain_scores()), reference)
