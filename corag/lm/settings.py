"""How a command loads and drives its model: the engine settings every backend takes, in one place.

`EngineSettings` covers loading (backend, dtype, batch limits, vLLM engine arguments) and rendering
(chat template variables, system prompt). Commands take it as one of their config dataclasses
(corag.config.parse_config), so its fields are flags and YAML keys of every command that loads a model.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from corag.errors import InputError
from corag.lm import LM, load_lm
from corag.lm.base import MAX_BATCH_TOKENS, SYSTEM_DEFAULT
from corag.lm.hub import check_model_source

BACKENDS = ("hf", "vllm", "vllm-async", "openai")
DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32")


@dataclass
class EngineSettings:
    """How a command loads its model. hf: dtype, device, batch limits; vLLM: the engine arguments."""

    _argument_group_name = "engine settings (corag.lm.settings)"

    backend: str = field(default="hf", metadata={"help": f"model backend, one of {BACKENDS}"})
    dtype: str = field(
        default="auto",
        metadata={"help": "auto (hf: bfloat16 on GPU, float32 on CPU; vLLM: the checkpoint's), bfloat16, "
        "float16 or float32"},
    )  # fmt: skip
    base_url: str = field(
        default="", metadata={"help": "openai: running server URL(s), comma-separated (e.g. vllm serve)"}
    )
    api_key: str | None = field(
        default=None,
        metadata={"help": "openai: the servers' API key (as `vllm serve --api-key`); default: $OPENAI_API_KEY. "
        "Never written to outputs"},
    )  # fmt: skip
    served_model_name: str | None = field(
        default=None,
        metadata={"help": "openai: the name the servers serve the model under (`vllm serve "
        "--served-model-name`); default: the first one /v1/models lists"},
    )  # fmt: skip
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
            return {
                "base_url": self.base_url,
                "api_key": self.api_key or os.environ.get("OPENAI_API_KEY") or None,
                "model_name": self.served_model_name,
                "max_context": self.max_model_len,
                **self.render_kwargs(),
            }
        return {
            "device": self.device,
            "dtype": None if self.dtype == "auto" else self.dtype,
            "batch_size": self.batch_size,
            "max_batch_tokens": self.max_batch_tokens,
            "max_context": self.max_model_len,
            **self.render_kwargs(),
        }

    def load(self, model: str) -> LM:
        """The LM of checkpoint `model` under these settings."""
        self.check()
        if self.backend != "openai":  # a served model's name is the server's business
            check_model_source(model, "--model")
        return load_lm(model, self.backend, **self.backend_kwargs())
