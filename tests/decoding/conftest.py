"""Fixtures for decoding tests: the tiny model through HFLM on the toy world, a word-overlap
retriever over the toy passages, and an LM wrapper that records every call it passes on."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import pytest

from corag.lm.base import Completion, GenerationRequest, Message, Score, ScoreRequest
from corag.types import Hit, Passage

_WORD = re.compile(r"\w+")


class DictCorpus:
    """Passages by id, as the chain reads them (corag.chain.CorpusLike)."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.by_id = {p.id: p for p in passages}

    def get_many(self, ids: Sequence[str]) -> list[Passage]:
        return [self.by_id[i] for i in ids]


class OverlapRetriever:
    """Ranks passages by how many distinct query words they share (ties by corpus order)."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.ids = [p.id for p in passages]
        self.words = [set(_WORD.findall(f"{p.title} {p.contents}".lower())) for p in passages]
        self.calls = 0

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.calls += 1
        out = []
        for query in queries:
            q = set(_WORD.findall(query.lower()))
            scores = [len(q & w) for w in self.words]
            order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]
            out.append([Hit(self.ids[i], float(scores[i])) for i in order])
        return out


@dataclass
class RecordingLM:
    """Passes every call to a real LM and records requests and results (for counting and recounting)."""

    lm: Any
    generated: list[tuple[GenerationRequest, Completion]] = field(default_factory=list)
    scored: list[tuple[ScoreRequest, Score]] = field(default_factory=list)
    batches: Counter = field(default_factory=Counter)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self.batches["generate"] += 1
        out = self.lm.generate(requests)
        self.generated.extend(zip(requests, out, strict=True))
        return out

    def score(self, requests: Sequence[ScoreRequest]) -> list[Score]:
        self.batches["score"] += 1
        out = self.lm.score(requests)
        self.scored.extend(zip(requests, out, strict=True))
        return out

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


@pytest.fixture(scope="session")
def tiny_lm(tiny_model_dir):
    """The tiny random Llama through the real transformers backend."""
    from corag.lm import load_lm

    return load_lm(tiny_model_dir, backend="hf", device="cpu")


@pytest.fixture(scope="session")
def toy_corpus(toy_world) -> DictCorpus:
    return DictCorpus(toy_world.passages)


@pytest.fixture(scope="session")
def toy_retriever(toy_world) -> OverlapRetriever:
    return OverlapRetriever(toy_world.passages)


def teach_short_answers(model, tokenizer, world, steps: int = 30, tail: int = 96, seed: int = 0) -> None:
    """A few optimiser steps on the toy world's three CoRAG tasks (gold sub-queries, sub-answers and
    answers), on the last `tail` prompt tokens only. A random model runs every generation to its
    length limit; this one answers in a few tokens and ends its turn, so decoding tests stay fast."""
    import random

    import torch

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
    end = tokenizer.eos_token_id
    data = []
    for messages, target in pairs:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"][-tail:]
        answer = tokenizer(target, add_special_tokens=False)["input_ids"] + [end]
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


@pytest.fixture(scope="session")
def short_model_dir(tiny_model_dir, toy_world, tmp_path_factory):
    """The tiny model of `tiny_model_dir` after `teach_short_answers`, saved to its own folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from corag.tinymodel import save_tiny

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    teach_short_answers(model, tokenizer, toy_world)
    return save_tiny(tmp_path_factory.mktemp("short-llama"), model, tokenizer)


@pytest.fixture(scope="session")
def short_lm(short_model_dir):
    """The briefly trained tiny model through the real transformers backend."""
    from corag.lm import load_lm

    return load_lm(short_model_dir, backend="hf", device="cpu")
