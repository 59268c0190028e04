"""The tiny-model kit: a tokenizer trained in process and a small Llama or Qwen2 built from config.

Saved folders load offline with AutoTokenizer / AutoModelForCausalLM, like any hub checkpoint. The
chat template wraps the assistant turn (content and end token) in `{% generation %}` markers, so trl
can train on assistant tokens only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

END, PAD = "<|end|>", "<|pad|>"
SPECIAL_TOKENS = [PAD, END, "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n' }}{% generation %}{{ message['content'] + '<|end|>' }}{% endgeneration %}"
    "{{ '\n' }}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4000) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts` (exact round trip, no unknown tokens)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=END,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=2048,
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    arch: str = "llama",
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 512,
    max_position_embeddings: int = 2048,
    seed: int = 0,
) -> PreTrainedModel:
    """A randomly initialised causal LM sized for CPU training (head_dim 64, as vLLM requires)."""
    # The vocabulary must cover the largest id, which can exceed len(vocab) after training.
    vocab_size = max(tokenizer.get_vocab().values()) + 1
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    configs = {"llama": LlamaConfig, "qwen2": Qwen2Config}
    if arch not in configs:
        raise ValueError(f"unknown arch {arch!r}; choose one of {sorted(configs)}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(configs[arch](**common), dtype=torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    return model


def save_tiny(path: str | Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> Path:
    """Save model and tokenizer to one folder that Auto* classes load offline."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
