"""Chat rendering shared by every backend: messages -> token ids through the tokenizer's own template.

The template text already holds any begin-of-text token, so rendered text is tokenized without adding
special tokens again. Scored targets are located by rendering with and without the assistant turn, so no
model-specific token ids are needed anywhere. The system turn follows one setting for every call
(corag.lm.settings.EngineSettings.system_prompt): the template's default, none, or a given text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from transformers import PreTrainedTokenizerBase

from corag.errors import InputError
from corag.lm.base import SYSTEM_DEFAULT, SYSTEM_NONE, Message, ScoreRequest

CACHE_SIZE = 65536
# An assistant message may carry `pieces`, the texts its content joins: its ids are then each piece's
# ids, tokenized on its own, joined after the generation prompt (Search-R1's rolling prompt: the
# release tokenizes the prompt, each response and each inserted block separately and concatenates).
PIECES = "pieces"
PROBES = ("CoragProbeOne", "CoragProbeTwo", "CoragProbeThree")  # contents no template alters


def _key(messages: Sequence[Message]) -> str:
    return json.dumps(list(messages), ensure_ascii=False, sort_keys=True)


class ChatRenderer:
    """Renders chat messages to token ids with a tokenizer's chat template; results are cached
    because strategies count a prompt's tokens before sending it.

    `template_kwargs` go to every rendering; a template with an `enable_thinking` switch (Qwen3) gets
    False unless told otherwise, since every call wants the answer itself. `system_prompt` is
    "default" (messages as given: the template adds its own system turn, if any), "none" (the template's
    default turn cut out, so a call without a system message has no system turn) or a text, the system
    message of every call (put before a method's own system message, if it writes one).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        name: str = "",
        template_kwargs: Mapping[str, Any] | None = None,
        system_prompt: str = SYSTEM_DEFAULT,
    ) -> None:
        if not tokenizer.chat_template:
            raise InputError(
                "the tokenizer has no chat template; corag renders every prompt with the model's own "
                "template, so use an instruct/chat checkpoint or set tokenizer.chat_template",
                file=name or tokenizer.name_or_path or None,
                field="chat_template",
            )
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        if "enable_thinking" in tokenizer.chat_template:
            self.template_kwargs.setdefault("enable_thinking", False)
        self.system_prompt = system_prompt
        self._default_system = ("", "")
        if system_prompt == SYSTEM_NONE:
            self._default_system = self._find_default_system(name or tokenizer.name_or_path or "")
        self._prompt = lru_cache(maxsize=CACHE_SIZE)(self._render_prompt)
        self._scored = lru_cache(maxsize=CACHE_SIZE)(self._render_scored)
        self.end_ids = self._end_of_turn_ids()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` with no special tokens added (templates carry their own)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: Sequence[Message]) -> tuple[int, ...]:
        """Ids of the conversation followed by the assistant generation prompt; a conversation that
        ends with an assistant message is continued from that message's text instead, or, when the
        message has `pieces`, from the generation prompt followed by each piece's own ids."""
        return self._prompt(_key(messages))

    def scored_ids(self, messages: Sequence[Message], target: str) -> tuple[tuple[int, ...], int]:
        """Ids of the conversation with `target` as the assistant turn, cut after its end-of-turn token,
        and the index where the target's tokens begin (the scored tokens are ids[start:])."""
        return self._scored(_key(messages), target)

    def _template(self, messages: list[Message], generation_prompt: bool) -> str:
        """The template's text of `messages` under the system prompt setting."""
        if self.system_prompt not in (SYSTEM_DEFAULT, SYSTEM_NONE):
            own = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
            rest = messages[1:] if own else messages
            content = f"{self.system_prompt}\n\n{own}" if own else self.system_prompt
            messages = [{"role": "system", "content": content}, *rest]
        text = self._apply(messages, generation_prompt)
        cut, keep = self._default_system
        return keep + text[len(cut) :] if cut and text.startswith(cut) else text

    def _apply(self, messages: list[Message], generation_prompt: bool) -> str:
        # A prompt that ends with an assistant turn is that turn left open: the reply continues it.
        open_turn = generation_prompt and bool(messages) and messages[-1]["role"] == "assistant"
        return self.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=generation_prompt and not open_turn,
            continue_final_message=open_turn,
            tokenize=False,
            **self.template_kwargs,
        )

    def _find_default_system(self, name: str) -> tuple[str, str]:
        """What the template writes before the first user turn when given no system message, and what
        of it to keep (a begin-of-text token before the system turn): rendering a user turn, an assistant
        turn and a user turn shows a turn's closing text (after the last user content) and so the user
        turn's header; the system turn's header is the same with "system" for "user"."""
        one, two, three = PROBES
        probe = [("user", one), ("assistant", two), ("user", three)]
        try:
            text = self._apply([{"role": role, "content": content} for role, content in probe], False)
            closing = text[text.index(three) + len(three) :]
            between = text[text.index(two) + len(two) : text.index(three)]
            if not closing or not between.startswith(closing):
                raise ValueError("turns close unlike each other")
            header = between[len(closing) :]
            prefix = text[: text.index(header + one)]
        except Exception as error:  # the template refused the probe, or it does not show its turns
            raise InputError(
                f"cannot tell where this chat template's turns begin ({error}), so its default system turn "
                "cannot be dropped; use system_prompt default or a text",
                file=name or None,
                field="system_prompt",
            ) from None
        system_header = header.replace("user", "system", 1)
        if system_header in prefix:  # keep what comes before the system turn (a begin-of-text token)
            return prefix, prefix[: prefix.index(system_header)]
        bos = self.tokenizer.bos_token or ""
        return prefix, (bos if bos and prefix.startswith(bos) and not header.startswith(bos) else "")

    def _render_prompt(self, key: str) -> tuple[int, ...]:
        messages = json.loads(key)
        if messages and messages[-1]["role"] == "assistant" and PIECES in messages[-1]:
            ids = self.encode(self._template(messages[:-1], True))
            return tuple(ids + [i for piece in messages[-1][PIECES] for i in self.encode(piece)])
        return tuple(self.encode(self._template(messages, True)))

    def _render_scored(self, key: str, target: str) -> tuple[tuple[int, ...], int]:
        messages = json.loads(key)
        prompt_text = self._template(messages, True)
        full_text = self._template([*messages, {"role": "assistant", "content": target}], False)
        # Templates may trim the content (Llama-3 does); accept the target as written or trimmed.
        content = next(
            (c for c in (target, target.strip()) if full_text.startswith(prompt_text + c)),
            None,
        )
        if content is None:
            raise ValueError(
                "the chat template does not render an assistant turn as the generation prompt followed "
                "by its content, so the target's tokens cannot be located (templates with a thinking "
                "block need chat_template_kwargs such as {'enable_thinking': False})"
            )
        prompt = self.encode(prompt_text)
        upto_content = self.encode(prompt_text + content)
        full = self.encode(full_text)
        if full[: len(upto_content)] != upto_content or upto_content[: len(prompt)] != prompt:
            raise ValueError("the target's tokens merge with the template's tokens around them")
        if len(full) == len(upto_content):
            raise ValueError("the chat template puts no end-of-turn token after the assistant content")
        return tuple(full[: len(upto_content) + 1]), len(prompt)

    def _end_of_turn_ids(self) -> frozenset[int]:
        """The token the template closes an assistant turn with, plus the tokenizer's eos token."""
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        ids_scored, _ = self.scored_ids(({"role": "user", "content": "Hello"},), "Hi")
        ids.add(ids_scored[-1])
        return frozenset(ids)


def truncate_ids(ids: Sequence[int], max_tokens: int, middle: bool) -> list[int]:
    """The first `max_tokens` ids, or with `middle` the first and last halves."""
    if len(ids) <= max_tokens:
        return list(ids)
    if not middle:
        return list(ids[:max_tokens])
    head = max_tokens - max_tokens // 2
    tail = max_tokens // 2
    return list(ids[:head]) + (list(ids[-tail:]) if tail else [])


class CountingLM:
    """Token counting and truncation shared by the backends, all through the chat renderer (what
    `generate` and `score` charge is exactly what these count)."""

    renderer: ChatRenderer
    tokenizer: PreTrainedTokenizerBase

    def count_prompt_tokens(self, messages: Sequence[Message]) -> int:
        return len(self.renderer.prompt_ids(messages))

    def count_score_tokens(self, request: ScoreRequest) -> int:
        return len(self.renderer.scored_ids(request.messages, request.target)[0])

    def count_tokens(self, text: str) -> int:
        return len(self.renderer.encode(text))

    def truncate_tokens(self, text: str, max_tokens: int, *, middle: bool = False) -> str:
        ids = self.renderer.encode(text)
        if len(ids) <= max_tokens:
            return text
        return self.tokenizer.decode(truncate_ids(ids, max_tokens, middle))
