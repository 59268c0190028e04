"""The transformers backend: batched generation with our own KV-cache decoding loop, and scoring.

Our own loop (not `model.generate`) gives each request its own temperature, length, stop strings and
seed. Every sampled sequence draws from its own generator seeded by (request seed, sample index), so a
request's outputs do not depend on which other requests share its batch.
"""

from __future__ import annotations

import hashlib
import inspect
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from corag.lm.base import (
    MAX_BATCH_TOKENS,
    SYSTEM_DEFAULT,
    ChoiceRequest,
    Choices,
    Completion,
    GenerationRequest,
    Sample,
    Score,
    ScoreRequest,
    choice_scores,
    fold_choices,
)
from corag.lm.render import ChatRenderer, CountingLM
from corag.types import Usage

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
UNBOUNDED = 1_000_000  # tokenizers without a real limit report a huge model_max_length
STOP_MARGIN = 8  # extra tokens decoded when looking for a stop string (a character split over tokens)


def sample_seed(seed: int, index: int) -> int:
    """A 62-bit seed for sample `index` of a request seeded with `seed` (well mixed, no collisions
    between nearby pairs, and room for vLLM to add sample indices within int64)."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


def stop_index(text: str, stops: Sequence[str]) -> int | None:
    """Where the earliest stop string starts in `text`, or None."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def completion_text(
    tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], end_ids: Collection[int], stops: Sequence[str]
) -> str:
    """The text of generated `ids`: without a final end-of-turn token, special tokens skipped, cut
    before the first stop string."""
    if ids and ids[-1] in end_ids:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    cut = stop_index(text, stops)
    return text if cut is None else text[:cut]


def context_error(prompt_tokens: int, max_context: int) -> ValueError:
    return ValueError(
        f"prompt of {prompt_tokens} tokens does not fit the model's context of {max_context} tokens"
    )


@dataclass
class _Seq:
    """One sequence being decoded: a request's sample."""

    request: int
    prompt: tuple[int, ...]
    max_new: int
    temperature: float
    stop: tuple[str, ...]
    generator: torch.Generator | None
    copies: int = 1  # greedy samples are identical: decode once, report `copies` times
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None  # kept when the request asks for them
    text: str | None = None  # set when finished
    done: bool = False


class HFLM(CountingLM):
    """A transformers causal LM behind the LM protocol (by default bf16 on GPU, fp32 on CPU; eval mode).

    A forward pass holds at most `batch_size` sequences and at most `max_batch_tokens` (None: no limit)
    tokens (rows x padded length, counting the new tokens of a generation), which bounds the memory
    of activations and the KV cache; a single longer sequence runs alone.
    """

    def __init__(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        batch_size: int = 64,
        max_batch_tokens: int | None = MAX_BATCH_TOKENS,
        max_context: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        system_prompt: str = SYSTEM_DEFAULT,
    ) -> None:
        dtype = None if dtype == "auto" else dtype
        if isinstance(dtype, str):
            if dtype not in DTYPES:
                raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
            dtype = DTYPES[dtype]
        if isinstance(model, (str, Path)):
            name = str(model)
            device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
            model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype).to(device)
        else:
            name = model.name_or_path
            if device is not None:
                model = model.to(device)
            if dtype is not None:
                model = model.to(dtype)
        self.model = model.eval()
        # transformers 5.24 renamed the forward argument `past_key_values` to `cache`; 5.19 has only the
        # old name, and the new releases warn on it.
        forward_args = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward_args else "past_key_values"
        self.device = model.device
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(name)
        self.renderer = ChatRenderer(self.tokenizer, name, chat_template_kwargs, system_prompt)
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.end_ids = self.renderer.end_ids | _config_eos_ids(model)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.end_ids)
        limits = [model.config.get_text_config().max_position_embeddings]
        if self.tokenizer.model_max_length < UNBOUNDED:
            limits.append(self.tokenizer.model_max_length)
        self._max_context = max_context or min(limits)

    @property
    def max_context(self) -> int:
        return self._max_context

    # Generation --------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Continue each request's conversation with an assistant turn, `n` samples each."""
        seqs, prompts = self._expand(requests)
        for batch in self._batches([(len(s.prompt), max(s.max_new, 0)) for s in seqs]):
            self._decode([seqs[i] for i in batch])
        texts: list[list[str]] = [[] for _ in requests]
        samples: list[list[Sample]] = [[] for _ in requests]
        generated = [0] * len(requests)
        for seq in seqs:
            texts[seq.request].extend([seq.text] * seq.copies)
            generated[seq.request] += len(seq.ids) * seq.copies
            if seq.logprobs is not None:
                sample = Sample(seq.prompt, tuple(seq.ids), tuple(seq.logprobs))
                samples[seq.request].extend([sample] * seq.copies)
        return [
            Completion(tuple(t), Usage(p, g, 1), tuple(s))
            for p, t, g, s in zip(prompts, texts, generated, samples, strict=True)
        ]

    def _batches(self, sizes: Sequence[tuple[int, int]]) -> list[list[int]]:
        """Indices of (prompt tokens, new tokens) items, longest prompt first, cut into micro-batches
        within `batch_size` rows and `max_batch_tokens` tokens (rows x (longest prompt + most new))."""
        order = sorted(range(len(sizes)), key=lambda i: -sizes[i][0])
        limit = self.max_batch_tokens
        batches: list[list[int]] = []
        batch: list[int] = []
        width = new = 0
        for i in order:
            prompt, extra = sizes[i]
            grown = (len(batch) + 1) * (max(width, prompt) + max(new, extra))
            if batch and (len(batch) >= self.batch_size or (limit is not None and grown > limit)):
                batches.append(batch)
                batch, width, new = [], 0, 0
            batch.append(i)
            width, new = max(width, prompt), max(new, extra)
        return [*batches, batch] if batch else batches

    def _expand(self, requests: Sequence[GenerationRequest]) -> tuple[list[_Seq], list[int]]:
        """One sequence per sample, each sampled one with its own seeded generator; the `n` samples of
        a greedy request are one sequence (its generated tokens charged `n` times, as if decoded `n` times)."""
        seqs, prompts = [], []
        for r, request in enumerate(requests):
            prompt = self.renderer.prompt_ids(request.messages)
            if len(prompt) > self.max_context:
                raise context_error(len(prompt), self.max_context)
            prompts.append(len(prompt))
            max_new = min(request.max_new_tokens, self.max_context - len(prompt))
            logprobs = [] if request.logprobs else None
            if request.temperature <= 0:
                seqs.append(_Seq(r, prompt, max_new, 0.0, request.stop, None, request.n, logprobs=logprobs))
                continue
            seed = request.seed if request.seed is not None else secrets.randbits(63)
            for j in range(request.n):
                generator = torch.Generator(self.device).manual_seed(sample_seed(seed, j))
                kept = None if logprobs is None else []  # a list of its own for each sample
                seqs.append(
                    _Seq(r, prompt, max_new, request.temperature, request.stop, generator, logprobs=kept)
                )
        return seqs, prompts

    @torch.inference_mode()
    def _decode(self, seqs: list[_Seq]) -> None:
        """Decode one micro-batch with left padding and a KV cache; finished rows leave the batch."""
        for seq in seqs:
            if seq.max_new <= 0:
                self._finish(seq)
        active = [s for s in seqs if not s.done]
        if not active:
            return
        width = max(len(s.prompt) for s in active)
        input_ids = torch.tensor(
            [[self.pad_id] * (width - len(s.prompt)) + list(s.prompt) for s in active], device=self.device
        )
        mask = torch.tensor(
            [[0] * (width - len(s.prompt)) + [1] * len(s.prompt) for s in active], device=self.device
        )
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        while True:
            out = self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_arg: cache},
            )
            tokens, logprobs = self._pick(active, out.logits[:, -1, :].float())
            for seq, token, logprob in zip(active, tokens.tolist(), logprobs, strict=True):  # one sync
                if seq.logprobs is not None:
                    seq.logprobs.append(logprob)
                self._advance(seq, token)
            keep = [i for i, s in enumerate(active) if not s.done]
            if not keep:
                return
            if len(keep) < len(active):
                rows = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(rows)
                mask, positions, tokens = mask[rows], positions[rows], tokens[rows]
                active = [active[i] for i in keep]
            input_ids = tokens[:, None]
            mask = torch.cat([mask, mask.new_ones(len(active), 1)], dim=1)
            positions = positions[:, -1:] + 1

    def _pick(self, active: list[_Seq], logits: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
        """Next token of every row, left on the device: greedy rows by argmax, sampled rows each from
        its own generator; and, for rows that keep them, the token's log-probability under the
        distribution it was drawn from (0.0 for the others)."""
        tokens = logits.argmax(-1)
        for i, seq in enumerate(active):
            if seq.generator is not None:
                probs = torch.softmax(logits[i] / seq.temperature, dim=-1)
                tokens[i] = torch.multinomial(probs, 1, generator=seq.generator)[0]
        keep = [i for i, seq in enumerate(active) if seq.logprobs is not None]
        if not keep:
            return tokens, [0.0] * len(active)
        rows = torch.tensor(keep, device=logits.device)
        scale = torch.tensor([active[i].temperature or 1.0 for i in keep], device=logits.device)
        picked = (logits[rows] / scale[:, None]).log_softmax(-1).gather(-1, tokens[rows, None])[:, 0]
        logprobs = [0.0] * len(active)
        for i, value in zip(keep, picked.tolist(), strict=True):
            logprobs[i] = value
        return tokens, logprobs

    def _advance(self, seq: _Seq, token: int) -> None:
        seq.ids.append(token)
        seq.done = token in self.end_ids or len(seq.ids) >= seq.max_new or self._stopped(seq)
        if seq.done:
            self._finish(seq)

    def _stopped(self, seq: _Seq) -> bool:
        """Whether a stop string ends in the newest token. Only the last tokens are decoded: enough for
        the longest stop string (a token holds at least one character) plus a margin for characters
        split over tokens; the finished text is still cut at its first stop string by a full decode."""
        if not seq.stop:
            return False
        window = max(len(s) for s in seq.stop) + STOP_MARGIN
        return (
            stop_index(self.tokenizer.decode(seq.ids[-window:], skip_special_tokens=True), seq.stop)
            is not None
        )

    def _finish(self, seq: _Seq) -> None:
        seq.text, seq.done = completion_text(self.tokenizer, seq.ids, self.end_ids, seq.stop), True

    # Scoring -----------------------------------------------------------------------------------

    def score(self, requests: Sequence[ScoreRequest]) -> list[Score]:
        """Log-probabilities of each target's tokens (content and end-of-turn) after its messages."""
        rendered = [self.renderer.scored_ids(r.messages, r.target) for r in requests]
        for ids, _ in rendered:
            if len(ids) > self.max_context:
                raise context_error(len(ids), self.max_context)
        results: list[Score | None] = [None] * len(requests)
        for chunk in self._batches([(len(ids), 0) for ids, _ in rendered]):
            heat = [requests[i].temperature for i in chunk]
            for i, logprobs in zip(chunk, self._score_batch([rendered[i] for i in chunk], heat), strict=True):
                ids, start = rendered[i]
                results[i] = Score(
                    tuple(logprobs), Usage(len(ids), 0, 1), tuple(ids[:start]), tuple(ids[start:])
                )
        return results

    def score_choices(self, requests: Sequence[ChoiceRequest]) -> list[Choices]:
        """Each request's targets scored in the one `score` batch, its prompt metered once."""
        return fold_choices(requests, self.score(choice_scores(requests)))

    @torch.inference_mode()
    def _score_batch(
        self, rendered: list[tuple[tuple[int, ...], int]], temperatures: list[float]
    ) -> list[list[float]]:
        """One left-padded forward pass, each row's logits divided by its temperature; the scored tokens end
        every row, so only the last positions' logits are computed."""
        width = max(len(ids) for ids, _ in rendered)
        keep = max(len(ids) - start for ids, start in rendered) + 1
        input_ids = torch.tensor(
            [[self.pad_id] * (width - len(ids)) + list(ids) for ids, _ in rendered], device=self.device
        )
        mask = torch.tensor(
            [[0] * (width - len(ids)) + [1] * len(ids) for ids, _ in rendered], device=self.device
        )
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep
        )
        heat = torch.tensor(temperatures, device=self.device, dtype=torch.float32)[:, None, None]
        logprobs = (out.logits[:, :-1, :].float() / heat).log_softmax(-1)  # position p predicts token p + 1
        targets = input_ids[:, width - keep + 1 :]
        picked = logprobs.gather(-1, targets[..., None])[..., 0].cpu()
        return [
            picked[i, keep - 1 - (len(ids) - start) :].tolist() for i, (ids, start) in enumerate(rendered)
        ]


def _config_eos_ids(model: PreTrainedModel) -> frozenset[int]:
    """End ids the checkpoint's generation config declares (one id or a list)."""
    config = model.generation_config
    eos = config.eos_token_id if config is not None else None
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)
