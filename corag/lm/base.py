"""The one LM protocol every backend implements and every strategy uses.

Requests are chat messages; backends render them with the tokenizer's own chat template, so no
model-specific token ids appear anywhere. Usage is counted from the tokenizer's ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from corag.errors import InputError
from corag.types import Usage

Message = dict[str, str]  # {"role": "user" | "assistant" | "system", "content": "..."}

# The system turn of every call: the template's own ("default"), cut out ("none"), or a given text.
SYSTEM_DEFAULT, SYSTEM_NONE = "default", "none"
MAX_BATCH_TOKENS = 16384  # transformers backend: tokens per forward pass, unless told otherwise


@dataclass(frozen=True)
class GenerationRequest:
    """One chat prompt to continue with an assistant turn, sampled `n` times.

    temperature 0 is greedy. `seed` makes sampling reproducible per request, independent of batching.
    Generation stops at the end-of-turn token, at `max_new_tokens`, or at the first stop string
    (which is removed from the text). With `logprobs`, the completion also keeps each sample's exact
    tokens and their log-probabilities (`Completion.samples`), as reinforcement learning needs them.
    """

    messages: tuple[Message, ...]
    max_new_tokens: int = 128
    temperature: float = 0.0
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False


@dataclass(frozen=True)
class Sample:
    """The exact tokens of one generated text: the rendered prompt's ids, the generated ids as the
    sampler drew them (a final end-of-turn token included; not cut at a stop string), and each
    generated token's log-probability under the distribution it was drawn from (the logits divided by
    the request's temperature; at temperature 0, the plain distribution)."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclass(frozen=True)
class Completion:
    """The `n` sampled texts of one request and the tokens it cost: the prompt once (the engine fills
    it once for all `n` samples, as the CoRAG release counts it) plus the generated tokens of every sample."""

    texts: tuple[str, ...]
    usage: Usage
    samples: tuple[Sample, ...] = ()  # one per text, only when the request asked for `logprobs`


@dataclass(frozen=True)
class ScoreRequest:
    """Score `target` as the assistant turn that follows `messages`, under the model's distribution with
    its logits divided by `temperature` (1: the model's own)."""

    messages: tuple[Message, ...]
    target: str
    temperature: float = 1.0


@dataclass(frozen=True)
class Score:
    """Log-probabilities of the target's tokens: its content and the end-of-turn token; where the backend
    renders token ids itself, also the ids scored: the prompt's and the target's (`token_ids`, one per
    log-probability)."""

    logprobs: tuple[float, ...]
    usage: Usage
    prompt_ids: tuple[int, ...] = ()
    token_ids: tuple[int, ...] = ()

    @property
    def mean(self) -> float:
        return sum(self.logprobs) / len(self.logprobs)


@dataclass(frozen=True)
class ChoiceRequest:
    """Score each of `targets` as the assistant turn that follows `messages`, in one call: the prompt is
    read once and metered once (the paper's stop decision: Yes or No, one call)."""

    messages: tuple[Message, ...]
    targets: tuple[str, ...]
    temperature: float = 1.0

    def score_requests(self) -> list[ScoreRequest]:
        return [ScoreRequest(self.messages, target, self.temperature) for target in self.targets]


@dataclass(frozen=True)
class Choices:
    """The scores of a ChoiceRequest's targets, in its order, and what the one call cost: the prompt's
    tokens once plus every target's."""

    scores: tuple[Score, ...]
    usage: Usage


def choice_scores(requests: Sequence[ChoiceRequest]) -> list[ScoreRequest]:
    """Every target of every choice request as a score request, in order: one backend `score` batch."""
    return [score for request in requests for score in request.score_requests()]


def fold_choices(requests: Sequence[ChoiceRequest], scores: Sequence[Score]) -> list[Choices]:
    """The scores of `choice_scores(requests)` back into one Choices a request, each metered as one call:
    its prompt's ids once (the targets share them) and each target's ids."""
    out, at = [], 0
    for request in requests:
        own = tuple(scores[at : at + len(request.targets)])
        at += len(own)
        prompt = own[0].usage.total - len(own[0].logprobs)  # a score meters its prompt and its target
        out.append(Choices(own, Usage(prompt + sum(len(s.logprobs) for s in own), 0, 1)))
    return out


def check_model_temperature(requests: Sequence[ScoreRequest], backend: str) -> None:
    """Refuse scoring at a temperature other than 1 where the backend reads the model's own log-probabilities
    (prompt log-probabilities come before any sampling parameter)."""
    for request in requests:
        if request.temperature != 1.0:
            raise InputError(
                f"{backend} scores at temperature 1 only, got {request.temperature}", field="temperature"
            )


class LM(Protocol):
    """A chat model that generates and scores in batches."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]: ...

    def score(self, requests: Sequence[ScoreRequest]) -> list[Score]: ...

    def score_choices(self, requests: Sequence[ChoiceRequest]) -> list[Choices]:
        """Each request's targets scored in one call, its prompt metered once (`fold_choices`)."""
        ...

    def count_prompt_tokens(self, messages: Sequence[Message]) -> int:
        """Tokens of the rendered prompt, generation prompt included (what `generate` charges)."""
        ...

    def count_score_tokens(self, request: ScoreRequest) -> int:
        """Tokens of prompt plus target as `score` processes them (what `score` charges)."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens of plain text, no special tokens (used by truncation rules)."""
        ...

    def truncate_tokens(self, text: str, max_tokens: int, *, middle: bool = False) -> str:
        """Cut `text` to `max_tokens` tokens: keep the start, or with `middle` the first and last halves."""
        ...

    @property
    def max_context(self) -> int: ...


class WrappedLM:
    """Passes every call to the LM `lm`; a subclass overrides what it observes or changes (call
    recording in tests, timing in benchmarks) and inherits the rest of the protocol."""

    def __init__(self, lm: LM) -> None:
        self.lm = lm

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return self.lm.generate(requests)

    def score(self, requests: Sequence[ScoreRequest]) -> list[Score]:
        return self.lm.score(requests)

    def score_choices(self, requests: Sequence[ChoiceRequest]) -> list[Choices]:
        """Through this wrapper's own `score`, so a subclass that changes scores changes these too."""
        return fold_choices(requests, self.score(choice_scores(requests)))

    def count_prompt_tokens(self, messages: Sequence[Message]) -> int:
        return self.lm.count_prompt_tokens(messages)

    def count_score_tokens(self, request: ScoreRequest) -> int:
        return self.lm.count_score_tokens(request)

    def count_tokens(self, text: str) -> int:
        return self.lm.count_tokens(text)

    def truncate_tokens(self, text: str, max_tokens: int, *, middle: bool = False) -> str:
        return self.lm.truncate_tokens(text, max_tokens, middle=middle)

    @property
    def max_context(self) -> int:
        return self.lm.max_context
