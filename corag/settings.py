"""Engine settings and generation limits: how every command loads and drives its model, in one place.

`EngineSettings` covers loading (backend, dtype, batch limits, vLLM engine arguments) and rendering
(chat template variables, system prompt); `GenerationLimits` the per-call new-token caps and stop
strings of the CoRAG calls. Commands read both from a YAML config and the command line: dataclass
commands (`corag sample`) inherit the fields, argparse commands (`predict`, `evaluate`) add them with
`add_arguments`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from corag.errors import InputError
from corag.prompts import ANSWER_MAX_NEW_TOKENS, SUBQUERY_MAX_NEW_TOKENS

BACKENDS = ("hf", "vllm", "vllm-async", "openai")
DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32")
SYSTEM_DEFAULT, SYSTEM_NONE = "default", "none"
MAX_BATCH_TOKENS = 16384  # transformers backend: tokens per forward pass, unless told otherwise

T = TypeVar("T")


@dataclass
class EngineSettings:
    """How a command loads its model. hf: dtype, device, batch limits; vLLM: the engine arguments."""

    backend: str = field(default="hf", metadata={"help": f"model backend, one of {BACKENDS}"})
    dtype: str = field(
        default="auto",
        metadata={"help": "auto (hf: bfloat16 on GPU, float32 on CPU; vLLM: the checkpoint's), bfloat16, "
        "float16 or float32"},
    )  # fmt: skip
    base_url: str = field(
        default="", metadata={"help": "openai: running server URL(s), comma-separated (e.g. vllm serve)"}
    )
    device: str | None = field(default=None, metadata={"help": "hf device (default: cuda if available)"})
    batch_size: int = field(default=64, metadata={"help": "hf: most sequences per forward pass"})
    max_batch_tokens: int | None = field(
        default=MAX_BATCH_TOKENS,
        metadata={"help": "hf: most tokens per forward pass (rows x padded length, with the new tokens "
        "when generating); bounds memory. A longer single sequence runs alone"},
    )  # fmt: skip
    max_model_len: int | None = field(
        default=None, metadata={"help": "context length (default: the model's own)"}
    )
    tensor_parallel_size: int = field(default=1, metadata={"help": "vLLM: GPUs per engine"})
    gpu_memory_utilization: float = field(default=0.9, metadata={"help": "vLLM: GPU memory fraction"})
    max_num_seqs: int | None = field(default=None, metadata={"help": "vLLM: most sequences per step"})
    enable_prefix_caching: bool = field(default=True, metadata={"help": "vLLM: reuse shared prompt prefixes"})
    engine_seed: int = field(default=0, metadata={"help": "vLLM: the engine's seed"})
    chat_template_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": 'chat template variables as JSON, e.g. {"enable_thinking": false} for Qwen3 '
        "(templates with an enable_thinking switch get false unless told)"},
    )  # fmt: skip
    system_prompt: str = field(
        default=SYSTEM_DEFAULT,
        metadata={"help": "system turn of every call: default (the template's own, e.g. Llama-3.1's date "
        "block), none (the template's default turn cut out), or the text of every call's system message"},
    )  # fmt: skip

    def __post_init__(self) -> None:
        if isinstance(self.chat_template_kwargs, str):
            try:
                self.chat_template_kwargs = json.loads(self.chat_template_kwargs)
            except json.JSONDecodeError as exc:
                raise InputError(f"not JSON: {exc}", field="chat_template_kwargs") from None
        if self.chat_template_kwargs is not None and not isinstance(self.chat_template_kwargs, dict):
            raise InputError("must be a mapping of names to values", field="chat_template_kwargs")

    def check(self) -> None:
        """Reject bad settings before loading anything."""
        if self.backend not in BACKENDS:
            raise InputError(f"unknown backend {self.backend!r}; choose one of {BACKENDS}", field="backend")
        if self.dtype not in DTYPE_CHOICES:
            raise InputError(f"unknown dtype {self.dtype!r}; choose one of {DTYPE_CHOICES}", field="dtype")
        for name in (
            "batch_size",
            "max_batch_tokens",
            "max_model_len",
            "tensor_parallel_size",
            "max_num_seqs",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"must be 1 or more, got {value}", field=name)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InputError(
                f"must be in (0, 1], got {self.gpu_memory_utilization}", field="gpu_memory_utilization"
            )
        if not self.system_prompt:
            raise InputError("give default, none or a text", field="system_prompt")
        if self.backend == "openai" and not self.base_url.strip():
            raise InputError("the openai backend needs the servers' URL(s)", field="base_url")

    def render_kwargs(self) -> dict[str, Any]:
        """What every backend's renderer takes: template variables and the system prompt."""
        return {"chat_template_kwargs": self.chat_template_kwargs, "system_prompt": self.system_prompt}

    def backend_kwargs(self) -> dict[str, Any]:
        """The arguments `corag.lm.load_lm` passes to the chosen backend."""
        if self.backend in ("vllm", "vllm-async"):
            return {
                "tensor_parallel_size": self.tensor_parallel_size,
                "dtype": self.dtype,
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "max_model_len": self.max_model_len,
                "max_num_seqs": self.max_num_seqs,
                "enable_prefix_caching": self.enable_prefix_caching,
                "seed": self.engine_seed,
                **self.render_kwargs(),
            }
        if self.backend == "openai":
            return {"base_url": self.base_url, "max_context": self.max_model_len, **self.render_kwargs()}
        return {
            "device": self.device,
            "dtype": None if self.dtype == "auto" else self.dtype,
            "batch_size": self.batch_size,
            "max_batch_tokens": self.max_batch_tokens,
            "max_context": self.max_model_len,
            **self.render_kwargs(),
        }

    def load(self, model: str) -> Any:
        """The LM of checkpoint `model` under these settings."""
        from corag.lm import load_lm

        self.check()
        return load_lm(model, self.backend, **self.backend_kwargs())


@dataclass
class GenerationLimits:
    """New-token caps and stop strings of the three CoRAG calls (defaults: the release's 64/128/128,
    no stop strings), and whether a sub-query is cut to its first line before it is searched.

    The release cleans a sub-query (strip, quotes, `Intermediate query N:` label) and searches all of
    it; its checkpoints write one line, so cutting at the first line changes nothing for them, while a
    chat model that rambles on no longer sends paragraphs to the retriever. Hence on by default.
    """

    subquery_max_new_tokens: int = field(
        default=SUBQUERY_MAX_NEW_TOKENS, metadata={"help": "new tokens of a sub-query"}
    )
    subanswer_max_new_tokens: int = field(
        default=ANSWER_MAX_NEW_TOKENS, metadata={"help": "new tokens of a sub-answer"}
    )
    final_max_new_tokens: int = field(
        default=ANSWER_MAX_NEW_TOKENS, metadata={"help": "new tokens of the final answer"}
    )
    subquery_stop: list[str] = field(default_factory=list, metadata={"help": "stop strings of sub-queries"})
    subanswer_stop: list[str] = field(default_factory=list, metadata={"help": "stop strings of sub-answers"})
    final_stop: list[str] = field(default_factory=list, metadata={"help": "stop strings of final answers"})
    subquery_first_line: bool = field(
        default=True, metadata={"help": "search only a sub-query's first non-empty line"}
    )

    def check(self) -> None:
        for name in ("subquery_max_new_tokens", "subanswer_max_new_tokens", "final_max_new_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"must be 1 or more, got {getattr(self, name)}", field=name)


DEFAULT_LIMITS = GenerationLimits()


def chain_settings(engine: EngineSettings, limits: GenerationLimits) -> dict[str, Any]:
    """The settings here that change a run's outputs (rendering and limits), those not at their
    defaults: what a resumable run adds to its config hash, so earlier runs keep theirs."""
    values = {
        "chat_template_kwargs": engine.chat_template_kwargs,
        "system_prompt": engine.system_prompt,
        **dataclasses.asdict(limits),
    }
    defaults = {
        "chat_template_kwargs": None,
        "system_prompt": SYSTEM_DEFAULT,
        **dataclasses.asdict(DEFAULT_LIMITS),
    }
    return {k: v for k, v in values.items() if v != defaults[k]}


def pick(cls: type[T], source: Any) -> T:
    """An instance of dataclass `cls` from the same-named attributes of `source` (parsed arguments, or a
    config dataclass that inherits the fields)."""
    return cls(**{f.name: getattr(source, f.name) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


def add_arguments(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """Add a `--field-name` flag for each field of dataclass `cls` (its default and help), so argparse
    commands take the same settings as dataclass ones."""
    group = parser.add_argument_group(f"{cls.__name__} (corag.settings)", (cls.__doc__ or "").split("\n")[0])
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kind = _plain_type(hints[f.name])
        help_ = f.metadata.get("help")
        if kind is bool:
            group.add_argument(
                flag, dest=f.name, default=default, help=help_, action=argparse.BooleanOptionalAction
            )
        elif kind is list:
            group.add_argument(flag, dest=f.name, default=default, help=help_, nargs="*")
        else:
            group.add_argument(flag, dest=f.name, default=default, help=help_, type=kind)


def _plain_type(hint: Any) -> type:
    """bool, list, int, float or str for a field's annotation (a dict is given as JSON text)."""
    if get_origin(hint) in (Union, types.UnionType):
        options = [a for a in get_args(hint) if a is not type(None)]
        return (
            str if dict in options or any(get_origin(a) is dict for a in options) else _plain_type(options[0])
        )
    if get_origin(hint) is list:
        return list
    return hint if hint in (bool, int, float) else str
