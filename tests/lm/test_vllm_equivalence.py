"""vLLM and transformers backends give the same greedy texts, scores and usage on one tiny checkpoint.

Runs where vllm is installed (tests/vllm/run.sh builds such an environment on CPU); skipped elsewhere.
The engine runs in process with eager execution so that it starts in seconds on a CPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
pytest.importorskip("vllm")

from corag.lm import load_lm  # noqa: E402
from corag.lm.base import GenerationRequest, ScoreRequest  # noqa: E402
from corag.lm.hf import HFLM  # noqa: E402
from corag.lm.vllm import VLLMLM  # noqa: E402
from corag.toy.tinymodel import build_tiny_model, save_tiny, train_tokenizer  # noqa: E402

TEXTS = [
    f"The director of film {i} is person {i * 7 % 13}, who was born in city {i % 5} of country {i % 3}."
    for i in range(200)
]


def chat(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


PROMPTS = [
    chat("Who is the director of film 3?"),
    chat("Where was person 5 born?"),
    ({"role": "system", "content": "Answer briefly."}, *chat("In which country is city 2 of country 1?")),
    chat("Film 12"),
    chat("Who directed film 8 and where was that person born?"),
]


def lively_model(tokenizer):
    """A tiny Llama whose random output layer is sharp enough that texts vary with the context and
    the end-of-turn token wins now and then (a fresh init only repeats its last token)."""
    model = build_tiny_model(tokenizer, hidden_size=64, num_heads=1, intermediate_size=128)
    weight = torch.randn(model.lm_head.weight.shape, generator=torch.Generator().manual_seed(0)) * 0.3
    weight[tokenizer.eos_token_id] *= 2
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(weight)
    return model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = train_tokenizer(TEXTS, vocab_size=400)
    return save_tiny(tmp_path_factory.mktemp("tiny-vllm"), lively_model(tokenizer), tokenizer)


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> HFLM:
    return HFLM(model_dir, batch_size=4)


@pytest.fixture(scope="module")
def vllm_lm(model_dir: Path) -> VLLMLM:
    # float32 on both sides, so the two backends compute the same numbers up to kernel rounding.
    lm = load_lm(model_dir, backend="vllm", dtype="float32", enforce_eager=True)
    assert isinstance(lm, VLLMLM)
    return lm


def test_context_and_counts_agree(hf: HFLM, vllm_lm: VLLMLM) -> None:
    assert vllm_lm.max_context == hf.max_context
    for messages in PROMPTS:
        assert vllm_lm.count_prompt_tokens(messages) == hf.count_prompt_tokens(messages)
    text = " ".join(TEXTS[:4])
    assert vllm_lm.count_tokens(text) == hf.count_tokens(text)
    assert vllm_lm.truncate_tokens(text, 9, middle=True) == hf.truncate_tokens(text, 9, middle=True)


def test_greedy_generations_are_identical(hf: HFLM, vllm_lm: VLLMLM) -> None:
    plain = [GenerationRequest(m, max_new_tokens=16) for m in PROMPTS]
    first = hf.generate(plain)
    ended = [c.usage.completion_tokens < 16 for c in first]
    assert any(ended) and not all(ended), "the prompts should cover both ways of stopping"
    # Stop strings taken from the texts themselves, so that they fire mid-generation.
    stops = [(c.texts[0][2:4],) if len(c.texts[0]) >= 4 else () for c in first]
    assert any(stops)
    requests = [
        *plain,
        *[GenerationRequest(m, max_new_tokens=16, stop=s) for m, s in zip(PROMPTS, stops, strict=True)],
        GenerationRequest(PROMPTS[1], max_new_tokens=5, n=3),
    ]
    assert vllm_lm.generate(requests) == hf.generate(requests)


def test_an_engine_built_elsewhere_answers_as_the_backend_that_built_it(
    model_dir: Path, hf: HFLM, vllm_lm: VLLMLM
) -> None:
    # GRPO's vLLM rollouts wrap the engine trl colocates with each training process.
    wrapped = VLLMLM.over_engine(vllm_lm.engine, hf.tokenizer, name=str(model_dir))
    assert wrapped.max_context == vllm_lm.max_context
    requests = [
        *[GenerationRequest(m, max_new_tokens=16) for m in PROMPTS],
        GenerationRequest(PROMPTS[2], max_new_tokens=10, temperature=1.0, n=3, seed=4),
    ]
    assert wrapped.generate(requests) == vllm_lm.generate(requests)
    assert wrapped.generate(requests[:-1]) == hf.generate(requests[:-1])


def test_scores_are_identical(hf: HFLM, vllm_lm: VLLMLM) -> None:
    targets = ["person 3", "city 4", "country 0", "", "person 8 was born in city 3."]
    requests = [ScoreRequest(m, t) for m, t in zip(PROMPTS, targets, strict=True)]
    ours, theirs = hf.score(requests), vllm_lm.score(requests)
    for a, b in zip(ours, theirs, strict=True):
        assert b.usage == a.usage
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-3)


def test_vllm_samples_follow_their_seeds(vllm_lm: VLLMLM) -> None:
    def sample(seed: int):
        request = GenerationRequest(PROMPTS[2], max_new_tokens=10, temperature=1.0, n=3, seed=seed)
        return vllm_lm.generate([request])[0]

    first = sample(4)
    assert sample(4) == first
    assert sample(5).texts != first.texts
    assert len(first.texts) == 3 and len(set(first.texts)) > 1
    assert first.usage.prompt_tokens == vllm_lm.count_prompt_tokens(PROMPTS[2])  # once for its n samples
    assert 3 <= first.usage.completion_tokens <= 30


def test_long_prompts_are_capped_or_refused_alike(hf: HFLM, vllm_lm: VLLMLM) -> None:
    context = hf.max_context
    overhead = hf.count_prompt_tokens(chat(""))
    text = hf.truncate_tokens(" ".join(TEXTS * 3), context - overhead - 3)
    near_full = chat(text)
    room = context - hf.count_prompt_tokens(near_full)
    assert 0 < room < 10
    request = GenerationRequest(near_full, max_new_tokens=50)
    [a], [b] = hf.generate([request]), vllm_lm.generate([request])
    assert a == b and a.usage.completion_tokens <= room
    too_long = GenerationRequest(chat(" ".join(TEXTS * 3)))
    for lm in (hf, vllm_lm):
        with pytest.raises(ValueError, match="does not fit the model's context"):
            lm.generate([too_long])


@pytest.fixture(scope="module")
def served(model_dir: Path):
    """A real `vllm serve` of the tiny checkpoint on CPU (float32, eager), on a free local port."""
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # `vllm serve`'s server, started as a module: the CPU wheel's `vllm` script looks up the version of a
    # distribution named "vllm" and fails, as that wheel is named vllm-cpu.
    server = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    cmd = [*server, "--served-model-name", "tiny", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--dtype", "float32", "--enforce-eager", "--seed", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve did not start: {proc.stderr.read().decode()[-3000:]}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_openai_backend_against_vllm_serve_equals_the_offline_engine(
    served: str, model_dir: Path, vllm_lm: VLLMLM
) -> None:
    from corag.lm.openai import OpenAILM

    lm = OpenAILM(model_dir, served)
    assert lm.model_name == "tiny" and lm.max_context == vllm_lm.max_context
    plain = [GenerationRequest(m, max_new_tokens=16) for m in PROMPTS]
    stops = [(c.texts[0][2:4],) if len(c.texts[0]) >= 4 else () for c in vllm_lm.generate(plain)]
    requests = [
        *plain,
        *[GenerationRequest(m, max_new_tokens=16, stop=s) for m, s in zip(PROMPTS, stops, strict=True)],
        GenerationRequest(PROMPTS[1], max_new_tokens=5, n=3),
    ]
    assert lm.generate(requests) == vllm_lm.generate(requests)
    targets = ["person 3", "city 4", "country 0", "", "person 8 was born in city 3."]
    scored = [ScoreRequest(m, t) for m, t in zip(PROMPTS, targets, strict=True)]
    for scoring in ("prompt_logprobs", "echo"):
        lm.scoring = scoring
        for a, b in zip(lm.score(scored), vllm_lm.score(scored), strict=True):
            assert a.usage == b.usage
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)


async def three_turns(ctx, messages: tuple[dict[str, str], ...]) -> list[str]:
    """A conversation of three generations, each continuing the last."""
    texts = []
    for _ in range(3):
        completion = await ctx.generate(GenerationRequest(messages, max_new_tokens=8))
        texts.append(completion.texts[0])
        messages = (*messages, {"role": "assistant", "content": texts[-1]}, *chat("And then?"))
    return texts


def test_the_asynchronous_engine_equals_the_offline_one(model_dir: Path, vllm_lm: VLLMLM) -> None:
    import asyncio

    from corag.executor import AsyncExecutor, Executor
    from corag.lm.vllm import AsyncVLLMLM

    lm = load_lm(model_dir, backend="vllm-async", dtype="float32", enforce_eager=True)
    assert isinstance(lm, AsyncVLLMLM) and lm.max_context == vllm_lm.max_context
    try:
        requests = [GenerationRequest(m, max_new_tokens=16) for m in PROMPTS]
        requests.append(GenerationRequest(PROMPTS[1], max_new_tokens=5, n=3))
        want = vllm_lm.generate(requests)
        assert lm.generate(requests) == want  # the blocking path (stepped executor)

        async def overlapping():  # two batches in flight at once, as the async executor sends them
            return await asyncio.gather(lm.agenerate(requests[:3]), lm.agenerate(requests[3:]))

        first, second = asyncio.run(overlapping())
        assert first + second == want
        targets = ["person 3", "city 4", "country 0", "", "person 8 was born in city 3."]
        scored = [ScoreRequest(m, t) for m, t in zip(PROMPTS, targets, strict=True)]
        for a, b in zip(asyncio.run(lm.ascore(scored)), vllm_lm.score(scored), strict=True):
            assert a.usage == b.usage
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)
        stepped = Executor(vllm_lm)
        ours = AsyncExecutor(lm, max_active=3)
        assert ours.run([three_turns(ours.context(), m) for m in PROMPTS]) == stepped.run(
            [three_turns(stepped.context(), m) for m in PROMPTS]
        )
    finally:
        lm.close()
