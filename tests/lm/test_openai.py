"""The OpenAI-compatible backend against small OpenAI-style servers on 127.0.0.1 that answer from the
tiny model (so its outputs can be compared with the transformers backend's): greedy texts, usage,
scores, servers taken in turn, retries. The same backend against a real `vllm serve` on CPU is in
tests/lm/test_vllm_equivalence.py (run by tests/vllm/run.sh)."""

from __future__ import annotations

import threading

import pytest
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from transformers import AutoModelForCausalLM, AutoTokenizer

from corag.errors import InputError
from corag.lm import load_lm
from corag.lm.base import ChoiceRequest, GenerationRequest, ScoreRequest
from corag.lm.hf import HFLM
from corag.lm.openai import OpenAILM, ServerError
from corag.retrieval.service import BackgroundServer


def chat(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


PROMPTS = [
    chat("What is the country of Netu?"),
    chat("Who founded Fithudus?"),
    ({"role": "system", "content": "Answer briefly."}, *chat("Where was the director of Lamo born?")),
    chat("Netu"),
]


class FakeServer:
    """`/v1/models` and `/v1/completions` as vLLM's server answers them (token-id prompts,
    `stop_token_ids`, `stop`, `return_token_ids`, `prompt_logprobs`, `echo` with `logprobs`), computed
    with plain transformers, one sequence at a time. `fail_first` answers that many requests 503."""

    def __init__(self, model_dir, max_model_len: int, fail_first: int = 0) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.max_model_len, self.fail_first = max_model_len, fail_first
        self.requests: list[dict] = []
        self.lock = threading.Lock()

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict:
            return {"object": "list", "data": [{"id": "tiny", "max_model_len": self.max_model_len}]}

        @app.post("/v1/completions")
        async def completions(request: Request) -> JSONResponse:
            body = await request.json()
            with self.lock:
                self.requests.append(body)
                if self.fail_first > 0:
                    self.fail_first -= 1
                    return JSONResponse({"error": "busy"}, status_code=503)
                return JSONResponse(self.complete(body))

        return app

    @torch.inference_mode()
    def logprobs(self, ids: list[int]) -> torch.Tensor:
        return torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), dim=-1)

    def complete(self, body: dict) -> dict:
        ids = list(body["prompt"])
        choices = []
        generator = torch.Generator().manual_seed(body["seed"]) if "seed" in body else None
        for index in range(body.get("n", 1)):
            out: list[int] = []
            while len(out) < body["max_tokens"]:
                row = self.logprobs(ids + out)[-1]
                if body["temperature"] > 0:
                    probs = torch.softmax(row / body["temperature"], dim=-1)
                    token = int(torch.multinomial(probs, 1, generator=generator))
                else:
                    token = int(row.argmax())
                out.append(token)
                text = self.tokenizer.decode(out, skip_special_tokens=True)
                if token in body.get("stop_token_ids", []) or any(s in text for s in body.get("stop") or []):
                    break
            choice = {"index": index, "text": self.tokenizer.decode(out, skip_special_tokens=True)}
            if body.get("return_token_ids"):
                choice["token_ids"] = out
            if body.get("prompt_logprobs") is not None or body.get("echo"):
                lp = self.logprobs(ids)
                rows = [None] + [float(lp[p - 1, ids[p]]) for p in range(1, len(ids))]
                if body.get("prompt_logprobs") is not None:
                    choice["prompt_logprobs"] = [
                        None if r is None else {str(ids[p]): {"logprob": r, "rank": 1}}
                        for p, r in enumerate(rows)
                    ]
                else:
                    choice["logprobs"] = {"token_logprobs": rows + [None] * len(out)}
            choices.append(choice)
        usage = {
            "prompt_tokens": len(ids),
            "completion_tokens": sum(len(c.get("token_ids", [])) for c in choices),
        }
        return {"object": "text_completion", "model": "tiny", "choices": choices, "usage": usage}


@pytest.fixture(scope="module")
def hf(short_model_dir) -> HFLM:
    return HFLM(short_model_dir, batch_size=4, device="cpu")


@pytest.fixture(scope="module")
def servers(short_model_dir, hf):
    fakes = [FakeServer(short_model_dir, hf.max_context) for _ in range(2)]
    with BackgroundServer(fakes[0].app()) as a, BackgroundServer(fakes[1].app()) as b:
        yield fakes, [a.url, b.url]


def test_greedy_texts_usage_and_scores_equal_the_transformers_backend(servers, hf, short_model_dir):
    fakes, urls = servers
    lm = load_lm(short_model_dir, backend="openai", base_url=",".join(urls), concurrency=4)
    assert isinstance(lm, OpenAILM) and lm.model_name == "tiny" and lm.max_context == hf.max_context
    requests = [GenerationRequest(m, max_new_tokens=12) for m in PROMPTS]
    requests += [
        GenerationRequest(PROMPTS[0], max_new_tokens=12, n=3),
        GenerationRequest(PROMPTS[1], stop=("the",)),
    ]
    got, want = lm.generate(requests), hf.generate(requests)
    assert [c.texts for c in got] == [c.texts for c in want]
    assert [c.usage for c in got] == [c.usage for c in want]
    assert all(len(f.requests) > 0 for f in fakes)  # the servers were taken in turn
    sent = fakes[0].requests[0]
    assert isinstance(sent["prompt"], list) and sent["stop_token_ids"] == sorted(lm.renderer.end_ids)

    scored = [ScoreRequest(m, "Netu is in Vamor.") for m in PROMPTS]
    for scoring in ("prompt_logprobs", "echo"):
        lm.scoring = scoring
        for a, b in zip(lm.score(scored), hf.score(scored), strict=True):
            assert a.usage == b.usage
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
            assert (a.prompt_ids, a.token_ids) == (b.prompt_ids, b.token_ids)
    # the stop decision's one call: both turns scored as the transformers backend scores them, the prompt
    # charged once
    choices = [ChoiceRequest(m, ("Yes", "No")) for m in PROMPTS]
    for a, b in zip(lm.score_choices(choices), hf.score_choices(choices), strict=True):
        assert a.usage == b.usage and a.usage.calls == 1
        assert a.usage.total == len(b.scores[0].prompt_ids) + sum(len(s.token_ids) for s in b.scores)
        for x, y in zip(a.scores, b.scores, strict=True):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    with pytest.raises(InputError, match="temperature 1 only, got 0.7"):
        lm.score([ScoreRequest(PROMPTS[0], "Yes", 0.7)])
    for m in PROMPTS:
        assert lm.count_prompt_tokens(m) == hf.count_prompt_tokens(m)


def test_seeded_sampling_is_reproducible(servers, short_model_dir):
    _, urls = servers
    lm = OpenAILM(short_model_dir, urls)
    request = GenerationRequest(PROMPTS[0], max_new_tokens=8, temperature=1.0, n=2, seed=7)
    first = lm.generate([request])[0]
    assert len(first.texts) == 2 and lm.generate([request])[0] == first


def test_retries_past_busy_and_dead_servers(short_model_dir, hf):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens there once closed
    busy = FakeServer(short_model_dir, hf.max_context, fail_first=2)
    with BackgroundServer(busy.app()) as up:
        lm = OpenAILM(short_model_dir, [up.url, dead], backoff_s=0.01)
        requests = [GenerationRequest(m, max_new_tokens=6) for m in PROMPTS]
        assert [c.texts for c in lm.generate(requests)] == [c.texts for c in hf.generate(requests)]
        lm = OpenAILM(short_model_dir, [up.url], retries=1, backoff_s=0.01)
        busy.fail_first = 5
        with pytest.raises(ServerError, match="HTTP 503"):
            lm.generate(requests[:1])
    with pytest.raises(ServerError):
        OpenAILM(short_model_dir, dead, retries=1, backoff_s=0.01)
    with pytest.raises(InputError, match="base_url"):
        OpenAILM(short_model_dir, " , ")


def test_predict_command_with_the_openai_backend_matches_hf(
    servers, short_model_dir, toy_dir, toy_world, tmp_path
):
    import json

    from corag.commands.predict import main
    from corag.retrieval.bm25 import build_bm25_folder

    _, urls = servers
    build_bm25_folder([toy_world.passages], tmp_path / "bm25")
    common = [
        "--model", str(short_model_dir), "--data", str(toy_dir / "test.jsonl"),
        "--corpus", str(toy_dir / "corpus.jsonl"), "--retriever", str(tmp_path / "bm25"), "--limit", "3",
        "--strategy", "greedy", "--max-steps", "2",
    ]  # fmt: skip
    runs = {}
    for backend, extra in (("hf", ["--device", "cpu"]), ("openai", ["--base-url", ",".join(urls)])):
        out = tmp_path / backend / "predictions.jsonl"
        assert main([*common, "--backend", backend, *extra, "--out", str(out)]) == 0
        runs[backend] = [json.loads(line) for line in out.read_text().splitlines()]
    keys = ("query_id", "subqueries", "subanswers", "predictions", "usage")
    assert [{k: r[k] for k in keys} for r in runs["openai"]] == [{k: r[k] for k in keys} for r in runs["hf"]]


class KeyedServer(FakeServer):
    """A server started as the official scripts start vLLM: `--api-key KEY` (every request needs
    `Authorization: Bearer KEY`, else 401) and `--served-model-name`, here two names."""

    def __init__(self, *args, key: str, names: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.key, self.names, self.seen_auth = key, names, []

    def app(self) -> FastAPI:
        app = super().app()
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", "") != "/v1/models"]

        @app.get("/v1/models")
        async def models() -> dict:
            return {
                "object": "list",
                "data": [{"id": n, "max_model_len": self.max_model_len} for n in self.names],
            }

        @app.middleware("http")
        async def check_key(request: Request, call_next):
            self.seen_auth.append(request.headers.get("authorization"))
            if request.headers.get("authorization") != f"Bearer {self.key}":
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
            return await call_next(request)

        return app


def test_api_key_and_served_model_name_from_the_engine_settings(short_model_dir, hf, monkeypatch):
    from corag.lm.settings import EngineSettings

    server = KeyedServer(short_model_dir, hf.max_context, key="sk-test", names=["other", "corag-8b"])
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with BackgroundServer(server.app()) as up:
        with pytest.raises(InputError, match=r"api_key.*HTTP 401.*OPENAI_API_KEY"):
            EngineSettings(backend="openai", base_url=up.url).load(short_model_dir)
        settings = EngineSettings(
            backend="openai", base_url=up.url, api_key="sk-test", served_model_name="corag-8b"
        )
        lm = settings.load(short_model_dir)
        requests = [GenerationRequest(PROMPTS[0], max_new_tokens=6)]
        assert (
            lm.model_name == "corag-8b" and lm.generate(requests)[0].texts == hf.generate(requests)[0].texts
        )
        assert server.requests[-1]["model"] == "corag-8b" and server.seen_auth[-1] == "Bearer sk-test"
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # the key from the environment
        assert EngineSettings(backend="openai", base_url=up.url).load(short_model_dir).model_name == "other"
    from corag.options import settings_record

    assert settings_record(settings)["api_key"] == "(set)"  # the key never reaches an output file
