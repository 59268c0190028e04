"""Language-model backends behind one protocol (corag.lm.base.LM): transformers, vLLM and OpenAI-compatible servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corag.lm.base import LM, Completion, GenerationRequest, Message, Score, ScoreRequest

__all__ = ["LM", "Completion", "GenerationRequest", "Message", "Score", "ScoreRequest", "load_lm"]


def load_lm(path: str | Path, backend: str = "hf", **kwargs: Any) -> LM:
    """Load a chat checkpoint with the "hf" (transformers), "vllm" (offline engine) or "vllm-async"
    (asynchronous engine) backend, or reach running servers with "openai" (kwargs: base_url="URL[,URL...]");
    kwargs go to the backend."""
    if backend == "hf":
        from corag.lm.hf import HFLM

        return HFLM(path, **kwargs)
    if backend == "vllm":
        from corag.lm.vllm import VLLMLM

        return VLLMLM(str(path), **kwargs)
    if backend == "vllm-async":
        from corag.lm.vllm import AsyncVLLMLM

        return AsyncVLLMLM(str(path), **kwargs)
    if backend == "openai":
        from corag.lm.openai import OpenAILM

        return OpenAILM(path, **kwargs)
    raise ValueError(f"unknown LM backend {backend!r}; choose 'hf', 'vllm', 'vllm-async' or 'openai'")
