"""The vLLM backends: the offline engine (`vllm`) and the asynchronous engine (`vllm-async`) on GPUs.

Prompts are rendered to token ids by the same code as the transformers backend (corag.lm.render), so
both backends see identical inputs and charge identical usage. vLLM is an optional extra, imported when
an engine is built.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from transformers import AutoTokenizer

from corag.lm.base import (
    SYSTEM_DEFAULT,
    ChoiceRequest,
    Choices,
    Completion,
    GenerationRequest,
    Sample,
    Score,
    ScoreRequest,
    check_model_temperature,
    choice_scores,
    fold_choices,
)
from corag.lm.hf import completion_text, context_error, sample_seed
from corag.lm.render import ChatRenderer, CountingLM
from corag.types import Usage


def _sample(prompt: Sequence[int], output: Any) -> Sample:
    """One vLLM sample's exact tokens and the log-probability of each. trl's colocated engine, which GRPO
    rollouts run on, reports them after temperature (`logprobs_mode="processed_logprobs"`), as the
    transformers backend does; an engine started with vLLM's default reports the raw distribution's."""
    ids = tuple(output.token_ids)
    logprobs = tuple(output.logprobs[p][token].logprob for p, token in enumerate(ids))
    return Sample(tuple(prompt), ids, logprobs)


class VLLMLM(CountingLM):
    """A vLLM offline engine behind the LM protocol (engine arguments: corag.lm.settings.EngineSettings).

    Each request's seed is mixed as in the transformers backend and handed to vLLM, which seeds sample
    `i` with seed + i. Greedy requests are decoded once and their text repeated `n` times.
    """

    def __init__(
        self,
        path: str,
        *,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        seed: int = 0,
        enable_prefix_caching: bool = True,
        max_num_seqs: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        system_prompt: str = SYSTEM_DEFAULT,
        **engine_kwargs: Any,
    ) -> None:
        self._render_with(AutoTokenizer.from_pretrained(path), path, chat_template_kwargs, system_prompt)
        if max_num_seqs is not None:
            engine_kwargs["max_num_seqs"] = max_num_seqs
        self._max_context = self._start(
            model=path,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
            enable_prefix_caching=enable_prefix_caching,
            **engine_kwargs,
        )

    @classmethod
    def over_engine(
        cls,
        engine: Any,
        tokenizer: Any,
        *,
        name: str = "",
        chat_template_kwargs: Mapping[str, Any] | None = None,
        system_prompt: str = SYSTEM_DEFAULT,
    ) -> VLLMLM:
        """An offline engine built elsewhere (trl's colocated engine during GRPO), behind the LM protocol."""
        lm = cls.__new__(cls)
        lm._render_with(tokenizer, name, chat_template_kwargs, system_prompt)
        lm.engine = engine
        lm._max_context = engine.llm_engine.model_config.max_model_len
        return lm

    def _render_with(
        self, tokenizer: Any, name: str, chat_template_kwargs: Mapping[str, Any] | None, system_prompt: str
    ) -> None:
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer, name, chat_template_kwargs, system_prompt)
        self.end_ids = sorted(self.renderer.end_ids)

    def _start(self, **engine_args: Any) -> int:
        """Build the engine; its context length."""
        from vllm import LLM

        self.engine = LLM(**engine_args)
        return self.engine.llm_engine.model_config.max_model_len

    @property
    def max_context(self) -> int:
        return self._max_context

    # Generation --------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Continue each request's conversation with an assistant turn, `n` samples each."""
        prompts, sent, params = self._generation(requests)
        return self._completions(requests, prompts, sent, self._run([prompts[i] for i in sent], params))

    def _generation(
        self, requests: Sequence[GenerationRequest]
    ) -> tuple[list[list[int]], list[int], list[Any]]:
        """Each request's prompt ids, the requests sent to the engine (those with room to generate) and
        their sampling parameters."""
        prompts = [list(self.renderer.prompt_ids(r.messages)) for r in requests]
        for prompt in prompts:
            if len(prompt) > self.max_context:
                raise context_error(len(prompt), self.max_context)
        room = [
            min(r.max_new_tokens, self.max_context - len(p)) for r, p in zip(requests, prompts, strict=True)
        ]
        sent = [i for i, r in enumerate(requests) if room[i] > 0 and r.n > 0]
        return prompts, sent, [self._sampling(requests[i], room[i]) for i in sent]

    def _completions(
        self,
        requests: Sequence[GenerationRequest],
        prompts: list[list[int]],
        sent: list[int],
        outputs: list[Any],
    ) -> list[Completion]:
        samples = {i: output.outputs for i, output in zip(sent, outputs, strict=True)}
        completions = []
        for i, request in enumerate(requests):
            copies = request.n if request.temperature <= 0 else 1
            outputs = list(samples.get(i, ())) * copies
            ids = [list(s.token_ids) for s in outputs]
            # Decoded as the transformers backend does: vLLM's incremental text drops a final
            # incomplete character, which a plain decode keeps as a replacement character.
            texts = tuple(completion_text(self.tokenizer, x, self.end_ids, request.stop) for x in ids)
            texts = texts if i in samples else ("",) * request.n  # no room left after the prompt
            generated = sum(len(x) for x in ids)
            kept = tuple(_sample(prompts[i], s) for s in outputs) if request.logprobs else ()
            completions.append(Completion(texts, Usage(len(prompts[i]), generated, 1), kept))
        return completions

    def _run(self, prompts: list[list[int]], params: list[Any]) -> list[Any]:
        """One engine call over token prompts (none for an empty batch)."""
        if not prompts:
            return []
        return self.engine.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)

    def _sampling(self, request: GenerationRequest, max_new: int) -> Any:
        """vLLM sampling parameters of one request; a greedy request is decoded once."""
        from vllm import SamplingParams

        greedy = request.temperature <= 0
        return SamplingParams(
            n=1 if greedy else request.n,
            temperature=max(request.temperature, 0.0),
            max_tokens=max_new,
            stop=list(request.stop) or None,
            stop_token_ids=self.end_ids,
            seed=None if greedy or request.seed is None else sample_seed(request.seed, 0),
            logprobs=0 if request.logprobs else None,  # 0: the sampled token's own log-probability
            **self._final_only(),
        )

    def _final_only(self) -> dict[str, Any]:
        """Extra sampling parameters of this engine (the offline engine returns final outputs anyway)."""
        return {}

    # Scoring -----------------------------------------------------------------------------------

    def score(self, requests: Sequence[ScoreRequest]) -> list[Score]:
        """Log-probabilities of each target's tokens (content and end-of-turn) after its messages,
        read from vLLM's prompt log-probabilities over prompt plus target."""
        rendered, params = self._scoring(requests)
        return self._scores(rendered, self._run([list(ids) for ids, _ in rendered], params))

    def score_choices(self, requests: Sequence[ChoiceRequest]) -> list[Choices]:
        """Each request's targets scored in the one `score` batch, its prompt metered once."""
        return fold_choices(requests, self.score(choice_scores(requests)))

    def _scoring(self, requests: Sequence[ScoreRequest]) -> tuple[list[tuple[Any, int]], list[Any]]:
        """Each request's ids (messages and target) with the target's start, and the engine parameters."""
        from vllm import SamplingParams

        check_model_temperature(requests, "vLLM")
        rendered = [self.renderer.scored_ids(r.messages, r.target) for r in requests]
        for ids, _ in rendered:
            # vLLM needs room for the one token it generates after the scored prompt.
            if len(ids) >= self.max_context:
                raise context_error(len(ids), self.max_context - 1)
        params = SamplingParams(
            max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False, **self._final_only()
        )
        return rendered, [params] * len(rendered)

    def _scores(self, rendered: list[tuple[Any, int]], outputs: list[Any]) -> list[Score]:
        scores = []
        for (ids, start), output in zip(rendered, outputs, strict=True):
            logprobs = tuple(output.prompt_logprobs[p][ids[p]].logprob for p in range(start, len(ids)))
            scores.append(Score(logprobs, Usage(len(ids), 0, 1), tuple(ids[:start]), tuple(ids[start:])))
        return scores


class AsyncVLLMLM(VLLMLM):
    """vLLM's asynchronous engine (`AsyncLLM`): every request enters the engine's running batch as soon
    as it is submitted, so a question's next call never waits for other questions' calls.

    The engine lives on its own event loop in a background thread. `agenerate` and `ascore` await one
    list of requests from any event loop (corag.executor submits each batch as it forms, without
    waiting for the batches in flight); `generate` and `score` block, so the stepped executor works too.
    """

    def _start(self, **engine_args: Any) -> int:
        from vllm import AsyncEngineArgs, AsyncLLMEngine  # AsyncLLMEngine: vLLM v1's AsyncLLM

        args = AsyncEngineArgs(**engine_args)
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="vllm-async", daemon=True).start()

        async def build() -> Any:  # the engine binds its output handler to the loop it starts on
            return AsyncLLMEngine.from_engine_args(args)

        self.engine = asyncio.run_coroutine_threadsafe(build(), self._loop).result()
        return self.engine.model_config.max_model_len

    def _final_only(self) -> dict[str, Any]:
        from vllm.sampling_params import RequestOutputKind

        return {"output_kind": RequestOutputKind.FINAL_ONLY}

    async def _gather(self, prompts: list[list[int]], params: list[Any]) -> list[Any]:
        async def one(prompt: list[int], param: Any) -> Any:
            outputs = [
                o async for o in self.engine.generate({"prompt_token_ids": prompt}, param, uuid.uuid4().hex)
            ]
            return outputs[-1]  # the final output only (FINAL_ONLY)

        return list(await asyncio.gather(*(one(p, q) for p, q in zip(prompts, params, strict=True))))

    def _submit(self, prompts: list[list[int]], params: list[Any]) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(self._gather(prompts, params), self._loop)

    def _run(self, prompts: list[list[int]], params: list[Any]) -> list[Any]:
        return self._submit(prompts, params).result() if prompts else []

    async def _await(self, prompts: list[list[int]], params: list[Any]) -> list[Any]:
        return await asyncio.wrap_future(self._submit(prompts, params)) if prompts else []

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """`generate`, awaited: the requests join the engine's running batch."""
        prompts, sent, params = self._generation(requests)
        outputs = await self._await([prompts[i] for i in sent], params)
        return self._completions(requests, prompts, sent, outputs)

    async def ascore(self, requests: Sequence[ScoreRequest]) -> list[Score]:
        """`score`, awaited: the requests join the engine's running batch."""
        rendered, params = self._scoring(requests)
        return self._scores(rendered, await self._await([list(ids) for ids, _ in rendered], params))

    async def ascore_choices(self, requests: Sequence[ChoiceRequest]) -> list[Choices]:
        """`score_choices`, awaited: the requests join the engine's running batch."""
        return fold_choices(requests, await self.ascore(choice_scores(requests)))

    def close(self) -> None:
        """Stop the engine, its tasks and its loop."""
        engine, self.engine = self.engine, None
        engine.shutdown()

        async def cancel_the_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel_the_rest(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        del engine  # its own __del__ (another shutdown) runs now, not at interpreter exit
