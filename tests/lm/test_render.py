"""The system prompt setting of the renderer: the template's default, none, or a given text, on the real
SmolLM2 checkpoint (whose template adds a default system turn), a Llama-3.1 template (a default block
written even beside a given system message) and through every method."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path

import pytest

from corag.decoding import STRATEGIES
from corag.errors import InputError
from corag.executor import Context, Executor
from corag.lm.base import Completion, GenerationRequest, ScoreRequest, WrappedLM
from corag.lm.hf import HFLM
from corag.lm.render import ChatRenderer
from corag.methods import METHODS
from corag.methods.demos import demos_from_examples
from corag.prompts import subanswer_messages, subquery_messages
from corag.retrieval.bm25 import BM25Retriever
from corag.toy.tinymodel import train_tokenizer
from corag.types import Passage, Step

SMOL_DEFAULT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
)
QUERY = "Were Scott Derrickson and Ed Wood of the same nationality?"
CALLS = [
    subquery_messages(QUERY, [Step("What is the nationality of Scott Derrickson?", "American")], "answer multi-hop questions"),
    subanswer_messages("What is the nationality of Ed Wood?", [Passage("0", "Ed Wood", "Ed Wood was an American filmmaker.")]),
]  # fmt: skip


@pytest.fixture(scope="module")
def smol_tokenizer(smollm2_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def rendered(renderer: ChatRenderer, messages: Sequence[dict[str, str]]) -> str:
    return renderer.tokenizer.decode(renderer.prompt_ids(tuple(messages)))


def test_smollm2_default_none_and_given_system_prompts(smol_tokenizer) -> None:
    default, none = ChatRenderer(smol_tokenizer), ChatRenderer(smol_tokenizer, system_prompt="none")
    given = ChatRenderer(smol_tokenizer, system_prompt="Answer with a short phrase.")
    for messages in CALLS:
        turn = f"<|im_start|>user\n{messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
        assert rendered(default, messages) == SMOL_DEFAULT + turn
        assert rendered(none, messages) == turn
        assert (
            rendered(given, messages) == f"<|im_start|>system\nAnswer with a short phrase.<|im_end|>\n{turn}"
        )
    # scored targets still sit right after the prompt, and prompts are the shorter by the default turn
    ids, start = none.scored_ids(tuple(CALLS[1]), "American")
    assert (
        ids[:start] == none.prompt_ids(tuple(CALLS[1]))
        and smol_tokenizer.decode(ids[start:]) == "American<|im_end|>"
    )
    removed = len(default.prompt_ids(tuple(CALLS[0]))) - len(none.prompt_ids(tuple(CALLS[0])))
    assert removed == len(default.encode(SMOL_DEFAULT))


def test_smollm2_generates_from_the_prompt_without_its_default_turn(smollm2_dir: Path) -> None:
    lm = HFLM(smollm2_dir, device="cpu", system_prompt="none")
    request = GenerationRequest(
        ({"role": "user", "content": "What is the capital of France?"},), max_new_tokens=12
    )
    (completion,) = lm.generate([request])
    assert completion.usage.prompt_tokens == len(lm.renderer.encode(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ))  # fmt: skip
    assert completion.texts[0].strip()


def llama31_tokenizer():
    tokenizer = train_tokenizer(["Where was person 5 born? City 3 of country 1."] * 20, vocab_size=300)
    tokenizer.add_special_tokens(
        {"bos_token": "<|begin_of_text|>", "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}
    )  # fmt: skip
    tokenizer.eos_token = "<|eot_id|>"
    tokenizer.chat_template = (files("trl") / "chat_templates" / "llama3_1.jinja").read_text()
    return tokenizer


def test_llama31_default_block_is_cut_and_the_begin_token_kept() -> None:
    tokenizer = llama31_tokenizer()
    user = ({"role": "user", "content": "Where was person 5 born?"},)
    none = rendered(ChatRenderer(tokenizer, system_prompt="none"), user)
    assert none == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhere was person 5 born?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    given = rendered(ChatRenderer(tokenizer, system_prompt="Be brief."), user)
    assert given.startswith("<|begin_of_text|><|start_header_id|>system") and "Be brief.<|eot_id|>" in given
    assert "Cutting Knowledge Date" in rendered(ChatRenderer(tokenizer), user)


def test_a_template_whose_turns_cannot_be_found_refuses_none() -> None:
    tokenizer = train_tokenizer(["a b c"] * 10, vocab_size=270)
    tokenizer.chat_template = (  # no headers, and assistant turns close unlike user turns
        "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] + '<|end|>' }}"
        "{% else %}{{ m['content'] + '<|end|>\n' }}{% endif %}{% endfor %}"
    )
    assert rendered(ChatRenderer(tokenizer, system_prompt="x"), ({"role": "user", "content": "hi"},))
    with pytest.raises(InputError, match="system_prompt"):
        ChatRenderer(tokenizer, system_prompt="none")


class Prompts(WrappedLM):
    """Keeps the rendered text of every prompt the wrapped LM is sent."""

    def __init__(self, lm: HFLM) -> None:
        super().__init__(lm)
        self.texts: list[str] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self.texts += [self.lm.tokenizer.decode(self.lm.renderer.prompt_ids(r.messages)) for r in requests]
        return self.lm.generate(requests)

    def score(self, requests: Sequence[ScoreRequest]):
        self.texts += [
            self.lm.tokenizer.decode(self.lm.renderer.scored_ids(r.messages, r.target)[0]) for r in requests
        ]
        return self.lm.score(requests)


SETTINGS = {
    "greedy": dict(max_steps=1, docs=3),
    "best_of_n": dict(max_steps=1, n=2, docs=3),
    "tree_search": dict(max_steps=1, docs=3),
    "ircot": dict(k=2, max_sentences=1, sentence_max_new_tokens=4, reader_max_new_tokens=4),
    "one_step": dict(k=3, reader_max_new_tokens=4),
    "no_retrieval": dict(reader_max_new_tokens=4),
    "searchain": dict(max_rounds=1, chain_max_new_tokens=8, reader_max_new_tokens=4),
    "search-r1": dict(max_turns=1, max_new_tokens=4),
}


def test_every_method_sends_every_call_with_the_given_system_prompt(
    toy_world, toy_dir: Path, short_model_dir: Path, tmp_path: Path
) -> None:
    from corag.chain import GenerationLimits
    from corag.data.corpus import Corpus

    corpus = Corpus.load(toy_dir / "corpus.jsonl", cache_dir=tmp_path / "cache")
    retriever = BM25Retriever.from_passages(toy_world.passages)
    lm = Prompts(HFLM(short_model_dir, system_prompt="Answer tersely."))
    demos = demos_from_examples(toy_world.train, corpus, n=1, retriever=retriever, seed=0)
    example = toy_world.test[0]
    assert set(SETTINGS) == set(STRATEGIES) | set(METHODS)
    for method, settings in SETTINGS.items():
        lm.texts.clear()
        extra = {"demonstrations": demos} if method in ("ircot", "one_step", "no_retrieval") else {}
        if method in STRATEGIES:
            extra = {"limits": GenerationLimits(4, 4, 4)}
        run = {**STRATEGIES, **METHODS}[method]
        Executor(lm, retriever).run(
            [run(Context(lm, retriever), example, corpus=corpus, **settings, **extra)]
        )
        assert lm.texts, method
        assert all(t.startswith("<|system|>\nAnswer tersely.<|end|>\n<|user|>\n") for t in lm.texts), method
