"""The OpenAI-compatible backend: already running servers (`vllm serve`, one or several) behind the LM protocol.

    corag predict ... --backend openai --base-url http://node1:8000,http://node2:8000

Prompts are rendered to token ids locally, by the same code as the other backends (corag.lm.render,
from the model's own tokenizer and chat template), and sent as token ids to `/v1/completions`, so the
server sees exactly what the offline engines see and usage is metered from the same ids. Requests go
to the servers in turn, `concurrency` at a time (the servers batch them), and are retried with
exponential backoff on connection errors, 429 and 5xx, moving to the next server each time.

Generation asks vLLM's extras `stop_token_ids` (the template's end-of-turn tokens) and
`return_token_ids` (the generated ids, decoded here as the other backends decode them; without them
the server's text is used). Scoring asks `prompt_logprobs: 0`, vLLM's log-probability of every prompt
token, over prompt plus target (or, with `scoring="echo"`, the OpenAI way: `echo` with `logprobs`). Greedy requests are decoded once and repeated `n` times; a seeded request
sends the seed as the vLLM backend hands it to its engine, so both give the same samples.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from transformers import AutoConfig, AutoTokenizer

from corag.errors import InputError
from corag.lm.base import (
    SYSTEM_DEFAULT,
    ChoiceRequest,
    Choices,
    Completion,
    GenerationRequest,
    Score,
    ScoreRequest,
    check_model_temperature,
    choice_scores,
    fold_choices,
)
from corag.lm.hf import completion_text, context_error, sample_seed, stop_index
from corag.lm.render import ChatRenderer, CountingLM
from corag.types import Usage

RETRIED = {408, 429, 500, 502, 503, 504}
SCORING = ("prompt_logprobs", "echo")  # vLLM's extra, or the OpenAI form


class ServerError(RuntimeError):
    """No server answered a request after every retry."""


class OpenAILM(CountingLM):
    """Generation and scoring through OpenAI-compatible `/v1/completions` servers.

    `path` is the model's folder or hub name (its tokenizer renders and counts); `model_name` the name
    the servers serve it under (default: the first one `/v1/models` lists).
    """

    def __init__(
        self,
        path: str | Path,
        base_url: str | Sequence[str],
        *,
        model_name: str | None = None,
        api_key: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        system_prompt: str = SYSTEM_DEFAULT,
        max_context: int | None = None,
        concurrency: int = 64,
        timeout: float = 600.0,
        retries: int = 6,
        backoff_s: float = 0.5,
        scoring: str = "prompt_logprobs",
    ) -> None:
        if scoring not in SCORING:
            raise InputError(f"unknown scoring request {scoring!r}; choose one of {SCORING}", field="scoring")
        self.scoring = scoring
        urls = base_url.split(",") if isinstance(base_url, str) else list(base_url)
        self.urls = [_api_root(u) for u in urls if u.strip()]
        if not self.urls:
            raise InputError("no server URL given", field="base_url")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.renderer = ChatRenderer(self.tokenizer, str(path), chat_template_kwargs, system_prompt)
        self.end_ids = sorted(self.renderer.end_ids)
        self.retries, self.backoff_s, self.concurrency = retries, backoff_s, max(concurrency, 1)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        self.http = httpx.Client(timeout=timeout, headers=headers, limits=limits)
        self._turn = itertools.count()
        self._lock = threading.Lock()
        served = self._request("GET", "/models", None)["data"]
        if not served and model_name is None:
            raise InputError(f"the server at {self.urls[0]} serves no model", field="base_url")
        card = next((m for m in served if m.get("id") == model_name), served[0] if served else {})
        self.model_name = model_name or card["id"]
        self._max_context = max_context or card.get("max_model_len") or _config_context(path)

    @property
    def max_context(self) -> int:
        return self._max_context

    def close(self) -> None:
        self.http.close()

    # Generation --------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Continue each request's conversation with an assistant turn, `n` samples each."""
        prompts = [self.renderer.prompt_ids(r.messages) for r in requests]
        for prompt in prompts:
            if len(prompt) > self.max_context:
                raise context_error(len(prompt), self.max_context)
        bodies = [self._generation_body(r, p) for r, p in zip(requests, prompts, strict=True)]
        answers = self._map([b for b in bodies if b is not None])
        completions = []
        for request, prompt, body in zip(requests, prompts, bodies, strict=True):
            if body is None:  # no room left after the prompt, or no sample asked for
                completions.append(Completion(("",) * request.n, Usage(len(prompt), 0, 1)))
                continue
            choices = sorted(next(answers)["choices"], key=lambda c: c.get("index", 0))
            copies = request.n if request.temperature <= 0 else 1
            texts, generated = [], 0
            for choice in choices:
                text, tokens = self._choice_text(choice, request.stop)
                texts += [text] * copies
                generated += tokens * copies
            completions.append(Completion(tuple(texts), Usage(len(prompt), generated, 1)))
        return completions

    def _generation_body(self, request: GenerationRequest, prompt: Sequence[int]) -> dict | None:
        room = min(request.max_new_tokens, self.max_context - len(prompt))
        if room <= 0 or request.n <= 0:
            return None
        greedy = request.temperature <= 0
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": list(prompt),
            "max_tokens": room,
            "temperature": max(request.temperature, 0.0),
            "n": 1 if greedy else request.n,
            "stop_token_ids": self.end_ids,
            "skip_special_tokens": True,
            "return_token_ids": True,
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if not greedy and request.seed is not None:
            body["seed"] = sample_seed(request.seed, 0)
        return body

    def _choice_text(self, choice: dict, stops: Sequence[str]) -> tuple[str, int]:
        """A sample's text and its generated tokens: decoded from its ids as the other backends do,
        or the server's text when it sends no ids."""
        ids = choice.get("token_ids")
        if ids is not None:
            return completion_text(self.tokenizer, ids, self.end_ids, stops), len(ids)
        text = choice.get("text") or ""
        cut = stop_index(text, stops)
        text = text if cut is None else text[:cut]
        return text, len(self.renderer.encode(choice.get("text") or ""))

    # Scoring -----------------------------------------------------------------------------------

    def score(self, requests: Sequence[ScoreRequest]) -> list[Score]:
        """Log-probabilities of each target's tokens (content and end-of-turn) after its messages,
        from the server's prompt log-probabilities over prompt plus target."""
        check_model_temperature(requests, "an OpenAI-compatible server")
        rendered = [self.renderer.scored_ids(r.messages, r.target) for r in requests]
        for ids, _ in rendered:
            if len(ids) >= self.max_context:  # room for the one token the server generates
                raise context_error(len(ids), self.max_context - 1)
        answers = self._map([self._score_body(ids) for ids, _ in rendered])
        scores = []
        for (ids, start), answer in zip(rendered, answers, strict=True):
            logprobs = _prompt_logprobs(answer["choices"][0], ids)
            scores.append(
                Score(tuple(logprobs[start:]), Usage(len(ids), 0, 1), tuple(ids[:start]), tuple(ids[start:]))
            )
        return scores

    def score_choices(self, requests: Sequence[ChoiceRequest]) -> list[Choices]:
        """Each request's targets scored in the one `score` batch, its prompt metered once."""
        return fold_choices(requests, self.score(choice_scores(requests)))

    def _score_body(self, ids: Sequence[int]) -> dict:
        body = {"model": self.model_name, "prompt": list(ids), "max_tokens": 1, "temperature": 0.0}
        if self.scoring == "prompt_logprobs":
            return {**body, "prompt_logprobs": 0}
        return {**body, "echo": True, "logprobs": 0}

    # Transport ---------------------------------------------------------------------------------

    def _map(self, bodies: list[dict]) -> Any:
        """POST every body to /completions, `concurrency` at a time; answers in order."""
        if not bodies:
            return iter(())
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(bodies))) as pool:
            return iter(list(pool.map(lambda b: self._request("POST", "/completions", b), bodies)))

    def _next_server(self) -> int:
        with self._lock:
            return next(self._turn) % len(self.urls)

    def _request(self, method: str, path: str, body: dict | None) -> dict:
        """One request with retries and backoff, to the servers in turn."""
        first = self._next_server()
        error = ""
        for attempt in range(self.retries + 1):
            url = self.urls[(first + attempt) % len(self.urls)]
            try:
                r = self.http.request(method, f"{url}{path}", json=body)
            except httpx.TransportError as e:
                error = f"{url}: {e!r}"
            else:
                if r.status_code < 400:
                    return r.json()
                if r.status_code == 401:
                    raise InputError(
                        f"the server at {url} needs an API key (HTTP 401): set api_key or OPENAI_API_KEY "
                        "to the key it was started with (vllm serve --api-key)",
                        field="api_key",
                    )
                if r.status_code not in RETRIED:
                    raise InputError(
                        f"the server at {url} refused the request (HTTP {r.status_code}): {r.text[:500]}",
                        field="base_url",
                    )
                error = f"{url}: HTTP {r.status_code} {r.text[:200]}"
            if attempt < self.retries:
                time.sleep(self.backoff_s * 2**attempt)
        raise ServerError(f"no server answered after {self.retries + 1} attempts; last: {error}")


def _api_root(url: str) -> str:
    """`http://host:port` or `.../v1` -> the `/v1` root of the OpenAI API."""
    url = url.strip().rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def _config_context(path: str | Path) -> int:
    config = AutoConfig.from_pretrained(path)
    return int(getattr(config, "max_position_embeddings", 0) or 0) or 2048


def _prompt_logprobs(choice: dict, ids: Sequence[int]) -> list[float]:
    """The log-probability of every prompt token after the first (position 0 gets 0.0).

    vLLM's `prompt_logprobs` is a list with one {token id: {"logprob": ...}} entry per prompt
    position (None first); the OpenAI `echo` form is `logprobs.token_logprobs`, prompt first."""
    rows = choice.get("prompt_logprobs")
    if rows is not None:
        out = [0.0]
        for p in range(1, len(ids)):
            entry = rows[p][str(ids[p])]
            out.append(float(entry["logprob"] if isinstance(entry, dict) else entry))
        return out
    echoed = (choice.get("logprobs") or {}).get("token_logprobs")
    if echoed is None or len(echoed) < len(ids):
        raise ServerError(
            "the server returned no prompt log-probabilities (needs vLLM's prompt_logprobs or echo)"
        )
    return [0.0] + [float(x) for x in echoed[1 : len(ids)]]
