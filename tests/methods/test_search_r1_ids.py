"""Search-R1's token ids as the release builds them: the templated prompt, each model turn and each
inserted block tokenized on their own and joined (search_r1/llm_agent/generation.py), on a byte-level
BPE tokenizer trained here with Qwen2's pre-tokenizer rule, where tokenizing the joined text instead
merges the `>` ending a search with the `\\n\\n` opening the inserted block."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from corag.lm.base import GenerationRequest
from corag.lm.hf import HFLM
from corag.lm.render import ChatRenderer
from corag.prompts import search_r1_information, search_r1_messages, search_r1_prompt
from corag.types import Passage

# transformers' models/qwen2/tokenization_qwen2.py, PRETOKENIZE_REGEX (Qwen2 and Qwen2.5's tokenizer.json)
QWEN2_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PASSAGES = [
    Passage("d1", '"Mara Velden"', "Mara Velden was born in Oslo."),
    Passage("d2", '"Oslo"', "A city."),
]


@pytest.fixture(scope="module")
def qwen_like() -> PreTrainedTokenizerFast:
    """A byte-level BPE with Qwen2's pre-tokenizer (the regex split, then bytes), trained on text shaped
    like Search-R1's trajectories, so that `>\\n\\n` is one token of its vocabulary."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    text = [
        search_r1_prompt("Where was Mara Velden born?"),
        "<think>I need to search.</think>\n<search> Mara Velden </search>" + search_r1_information(PASSAGES),
        "<answer> Oslo </answer>",
    ] * 50
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(text, trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    wrapped.chat_template = CHATML
    return wrapped


def trajectory_pieces() -> list[str]:
    return [
        "<think>I need to search.</think>\n<search> Mara Velden </search>",
        search_r1_information(PASSAGES),
        "<think>Oslo.</think>",
    ]


def test_piecewise_ids_are_the_pieces_ids_joined(qwen_like) -> None:
    renderer = ChatRenderer(qwen_like)
    question = "Where was Mara Velden born?"
    pieces = trajectory_pieces()
    user = [{"role": "user", "content": search_r1_prompt(question)}]
    opening = qwen_like.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    encode = renderer.encode
    ids = renderer.prompt_ids(search_r1_messages(question, pieces))
    assert ids == tuple(encode(opening) + [i for piece in pieces for i in encode(piece)])

    # tokenizing the joined text merges `>` and `\n\n` at the search's end: one token the release's
    # ids never hold there (they hold it where a piece has it, after `</information>`), and the two
    # sequences part at that point
    joint = qwen_like.convert_tokens_to_ids(">ĊĊ")
    assert joint != qwen_like.unk_token_id and joint is not None
    whole = encode(opening + "".join(pieces))
    assert whole != list(ids) and whole.count(joint) == ids.count(joint) + 1
    split = len(encode(opening) + encode(pieces[0]))
    assert ids[split - 1] == qwen_like.convert_tokens_to_ids(">") and whole[split - 1] == joint
    assert ids[: split - 1] == tuple(whole[: split - 1])


def test_the_backend_generates_from_the_piecewise_ids(qwen_like) -> None:
    """The transformers backend decodes from the ids the renderer builds (the vLLM and OpenAI backends
    send the same ids), and charges their count."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(qwen_like),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
    )
    lm = HFLM(Qwen2ForCausalLM(config), qwen_like, device="cpu")
    messages = search_r1_messages("Where was Mara Velden born?", trajectory_pieces())
    request = GenerationRequest(tuple(messages), max_new_tokens=3, logprobs=True)
    (completion,) = lm.generate([request])
    assert completion.samples[0].prompt_ids == lm.renderer.prompt_ids(messages)
    assert (
        completion.usage.prompt_tokens
        == lm.count_prompt_tokens(messages)
        == len(completion.samples[0].prompt_ids)
    )
