"""The tiny-model kit: a tokenizer trained in process and a small Llama or Qwen2 built from config.

Saved folders load offline with AutoTokenizer / AutoModelForCausalLM, like any hub checkpoint. The
chat template wraps the assistant turn (content and end token) in `{% generation %}` markers, so trl
can train on assistant tokens only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
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


# Pre-tokens: GPT-2's split (a word, number or run of symbols with its leading space), except that a
# space before a capital letter ends the piece before it instead of starting the next one.
PRE_TOKEN = (
    r" ?(?:\p{L}+|\p{N}+|[^\s\p{L}\p{N}]+) (?=\p{Lu})| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
)


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 4000, words: Iterable[str] = ()
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts` (exact round trip, no unknown tokens).

    A space before a capital letter joins the piece before it (`of Thidrul Kodrima.` is `ofĠ`,
    `ThidrulĠ`, `Kodrima`, `.`), so a name has the same tokens inside a passage and at the start of
    an answer, and each word of a name directly follows the one before it: answering is a plain copy
    where the previous token says what comes next. Each of `words` (runs of letters) becomes one
    token whatever the merges learned, bare and with a trailing space; the toy world passes its name
    pool, so every name-word of every world is one token.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKEN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok = _with_whole_words(tok, words)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=END,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=2048,
    )


def _with_whole_words(tok: Tokenizer, words: Iterable[str]) -> Tokenizer:
    """Add `words`, bare and followed by a space, to the BPE vocabulary as whole tokens.

    With `ignore_merges`, a pre-tokenized word found in the vocabulary is emitted as one token before
    any merge is tried; every other word still goes through the learned merges.
    """
    as_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    next_id = max([*vocab.values(), *(t["id"] for t in data["added_tokens"])]) + 1
    added = False
    for text in (form for word in words for form in (word, word + " ")):
        (piece, _), *rest = as_bytes.pre_tokenize_str(text)
        if not rest and piece not in vocab:
            vocab[piece] = next_id
            next_id += 1
            added = True
    if not added:
        return tok
    data["model"]["ignore_merges"] = True
    return Tokenizer.from_str(json.dumps(data))


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    arch: str = "llama",
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    head_dim: int | None = None,
    intermediate_size: int = 512,
    max_position_embeddings: int = 2048,
    seed: int = 0,
) -> PreTrainedModel:
    """A randomly initialised causal LM sized for CPU training.

    `head_dim` defaults to hidden_size // num_heads (64 with the defaults, as vLLM requires); a larger
    one makes the attention wider than the residual stream.
    """
    # The vocabulary must cover the largest id, which can exceed len(vocab) after training.
    vocab_size = max(tokenizer.get_vocab().values()) + 1
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=head_dim or hidden_size // num_heads,
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


def teach_turn_ends(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    world: Any,
    steps: int = 30,
    tail: int = 96,
    seed: int = 0,
) -> None:
    """A few optimiser steps on a toy world's three CoRAG tasks (gold sub-queries, sub-answers and
    answers), on the last `tail` prompt tokens only.

    A random model runs every generation to its length limit; after this it answers in a few tokens
    and ends its turn. Used by tests and benchmarks that need realistic call lengths, not skill.
    """
    import random

    from corag import prompts

    by_id = {p.id: p for p in world.passages}
    pairs = []
    for ex in world.train:
        desc, chain = prompts.task_description(ex.task), ex.decomposition
        for i, step in enumerate(chain):
            pairs.append((prompts.subquery_messages(ex.query, chain[:i], desc), step.subquery))
            docs = [by_id[d] for d in step.doc_ids]
            pairs.append((prompts.subanswer_messages(step.subquery, docs), step.subanswer))
        docs = [by_id[d] for d in ex.supporting_ids]
        pairs.append((prompts.final_answer_messages(ex.query, chain, desc, docs), ex.answers[0]))
    data = []
    for messages, target in pairs:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"][-tail:]
        answer = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        data.append((prompt + answer, [-100] * len(prompt) + answer))
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimiser = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(steps):
        batch = rng.sample(data, 16)
        width = max(len(x) for x, _ in batch)
        ids = torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x, _ in batch])
        labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in batch])
        mask = (torch.arange(width)[None] < torch.tensor([len(x) for x, _ in batch])[:, None]).long()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    model.eval()
