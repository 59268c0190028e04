"""Chain primitives: scoring against a hand-computed log-softmax, the learned stop's decision rule,
sub-answers with their documents, seeds, post-processing and the final answer's reserve."""

from __future__ import annotations

import math
import re

import pytest
import torch

from corag import chain
from corag.budget import BudgetExceeded
from corag.errors import InputError
from corag.executor import Executor
from corag.lm.base import Completion, ScoreRequest, WrappedLM
from corag.prompts import PENALTY_TARGET, penalty_messages, stop_messages
from corag.types import Hit, Passage, Step, Usage

QUERY = "What is the employer of the director of Getes Pathe?"
STEPS = [Step("Who is the director of Getes Pathe?", "Tima Sou", ("1",))]


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    from corag.lm import load_lm

    return load_lm(tiny_model_dir, backend="hf", device="cpu")


class WordRetriever:
    def __init__(self, passages):
        self.passages = passages

    def search(self, queries, k):
        out = []
        for q in queries:
            words = set(q.lower().split())
            order = sorted(self.passages, key=lambda p: -len(words & set(p.contents.lower().split())))
            out.append([Hit(p.id, 0.0) for p in order[:k]])
        return out


class Corpus:
    def __init__(self, passages):
        self.by_id = {p.id: p for p in passages}

    def get_many(self, ids):
        return [self.by_id[i] for i in ids]


def one(lm, coro_fn, retriever=None, budget=None):
    ex = Executor(lm, retriever)
    ctx = ex.context(budget)
    return ex.run([coro_fn(ctx)])[0], ctx


def test_penalty_is_the_mean_log_softmax_of_the_target_and_end_token(lm, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    got, ctx = one(lm, lambda ctx: chain.penalty(ctx, QUERY, STEPS))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    messages = penalty_messages(QUERY, STEPS)
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    target_ids = tok(PENALTY_TARGET, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids = torch.tensor([prompt_ids + target_ids])
    with torch.no_grad():
        logits = model(ids).logits[0]
    logprobs = torch.log_softmax(logits.double(), -1)
    expected = [logprobs[len(prompt_ids) - 1 + i, t].item() for i, t in enumerate(target_ids)]
    assert got == pytest.approx(sum(expected) / len(expected), abs=1e-4)
    assert ctx.meter.usage == Usage(len(prompt_ids) + len(target_ids), 0, 1)


def test_should_stop_compares_yes_plus_bias_with_no(lm):
    messages = tuple(stop_messages(QUERY, STEPS, "answer multi-hop questions"))
    yes, no = lm.score([ScoreRequest(messages, "Yes"), ScoreRequest(messages, "No")])
    gap = sum(no.logprobs) - sum(yes.logprobs)
    for bias, expected in [(gap + 0.01, True), (gap - 0.01, False), (1e9, True), (-1e9, False)]:
        decision, ctx = one(
            lm,
            lambda ctx, bias=bias: chain.should_stop(ctx, QUERY, STEPS, "answer multi-hop questions", bias),
        )
        assert decision is expected
        assert ctx.meter.usage.calls == 1


class ScoreCalls(WrappedLM):
    """Counts the backend's scoring batches and the requests in them."""

    def __init__(self, lm):
        super().__init__(lm)
        self.batches = []

    def score(self, requests):
        self.batches.append(len(requests))
        return self.lm.score(requests)


def test_the_stop_decision_is_one_call_metered_at_its_prompt_once(lm):
    """Both turns scored by one backend call, charged as one call: the prompt's tokens once plus each
    turn's (content and end of turn), the scores those of two separate scorings."""
    task = "answer multi-hop questions"
    counted = ScoreCalls(lm)
    _, ctx = one(counted, lambda ctx: chain.should_stop(ctx, QUERY, STEPS, task, 0.0))
    assert counted.batches == [2]
    messages = tuple(stop_messages(QUERY, STEPS, task))
    yes, no = lm.score([ScoreRequest(messages, "Yes"), ScoreRequest(messages, "No")])
    prompt = len(yes.prompt_ids)
    assert prompt == len(no.prompt_ids) == lm.count_prompt_tokens(messages)
    assert ctx.meter.usage == Usage(prompt + len(yes.token_ids) + len(no.token_ids), 0, 1)
    assert ctx.meter.usage.total < yes.usage.total + no.usage.total - prompt // 2  # not two prompts
    got = one(lm, lambda ctx: chain.stop_scores(ctx, QUERY, STEPS, task))[0]
    assert got[1].logprobs == pytest.approx(yes.logprobs) and got[2].logprobs == pytest.approx(no.logprobs)
    # a budget sees the same one call: it fits exactly, and one token less refuses it
    total = ctx.meter.usage.total
    assert (
        one(lm, lambda ctx: chain.should_stop(ctx, QUERY, STEPS, task, 0.0), budget=total)[
            1
        ].meter.usage.total
        == total
    )
    with pytest.raises(BudgetExceeded):
        one(lm, lambda ctx: chain.should_stop(ctx, QUERY, STEPS, task, 0.0), budget=total - 1)


def test_the_sampled_stop_draws_yes_with_its_share_of_the_two_turns(lm):
    """stop_choice (reinforcement learning's stop) draws from the very scores should_stop (bias 0) takes
    the likelier side of, at the model's own temperature: Yes comes with probability
    P(Yes) / (P(Yes) + P(No)); not sampled, it is should_stop."""
    task = "answer multi-hop questions"
    greedy, _ = one(lm, lambda ctx: chain.stop_choice(ctx, QUERY, STEPS, task, False, 1))
    assert greedy is one(lm, lambda ctx: chain.should_stop(ctx, QUERY, STEPS, task, 0.0))[0]
    messages = tuple(stop_messages(QUERY, STEPS, task))
    yes, no = lm.score([ScoreRequest(messages, "Yes"), ScoreRequest(messages, "No")])
    p_yes = 1 / (1 + math.exp(sum(no.logprobs) - sum(yes.logprobs)))
    assert greedy is (p_yes > 0.5)
    n = 400
    ex = Executor(lm, None)
    draws = ex.run([chain.stop_choice(ex.context(), QUERY, STEPS, task, True, seed) for seed in range(n)])
    assert 0.02 < p_yes < 0.98  # a decision with both sides in play
    assert abs(sum(draws) / n - p_yes) < 4 * math.sqrt(p_yes * (1 - p_yes) / n) + 1e-9


def test_subanswer_searches_reads_and_returns_a_step_with_doc_ids(lm, toy_world):
    passages = toy_world.passages
    retriever = WordRetriever(passages)
    subquery = toy_world.test[0].decomposition[0].subquery
    step, ctx = one(lm, lambda ctx: chain.subanswer(ctx, subquery, Corpus(passages)), retriever)
    assert step.subquery == subquery
    assert step.doc_ids == tuple(h.doc_id for h in retriever.search([subquery], 5)[0])
    assert ctx.meter.usage.calls == 1 and 0 < ctx.meter.usage.completion_tokens <= 128


def test_call_seed_depends_only_on_position():
    assert chain.call_seed("q1", 0, 1, 2) == chain.call_seed("q1", 0, 1, 2)
    seeds = {
        chain.call_seed(q, c, s, a) for q in ("q1", "q2") for c in (0, 1) for s in (0, 1) for a in (1, 2)
    }
    assert len(seeds) == 16 and all(0 <= s < 2**31 for s in seeds)


class EchoLM:
    """Scripted: always answers `reply`; a token per word."""

    max_context = 100_000

    def __init__(self, reply):
        self.reply = reply
        self.requests = []

    def generate(self, requests):
        self.requests += requests
        return [
            Completion((self.reply,) * r.n, Usage(self.count_prompt_tokens(r.messages), 3, 1))
            for r in requests
        ]

    def score(self, requests):
        raise AssertionError("not used")

    def count_prompt_tokens(self, messages):
        return sum(len(m["content"].split()) for m in messages)

    def count_score_tokens(self, request):
        return self.count_prompt_tokens(request.messages) + 2

    def count_tokens(self, text):
        return len(text.split())

    def truncate_tokens(self, text, max_tokens, *, middle=False):
        words = list(re.finditer(r"\S+", text))  # keeps the text's own spacing up to the last word kept
        return text if len(words) <= max_tokens else text[: words[max_tokens - 1].end()]


def test_next_subquery_is_post_processed_and_sent_as_asked():
    lm = EchoLM('"Intermediate query 2: Who founded Mentor?"')
    text, _ = one(
        lm, lambda ctx: chain.next_subquery(ctx, QUERY, STEPS, "answer multi-hop questions", 0.7, 11)
    )
    assert text == "Who founded Mentor?"
    (request,) = lm.requests
    assert (request.max_new_tokens, request.temperature, request.seed, request.n) == (64, 0.7, 11, 1)


def test_final_answer_may_use_the_reserve_that_other_calls_may_not():
    lm = EchoLM(" Rira ")
    passages = (Passage("1", "T", "text"),)
    cost = chain.final_cost(lm, QUERY, STEPS, "answer multi-hop questions", passages)
    question = chain.Question("q", QUERY, "answer multi-hop questions", Corpus(passages), passages)

    async def both(ctx):
        assert chain.keep_room_for_final(ctx, question, STEPS)
        assert ctx.meter.reserve == cost
        with pytest.raises(BudgetExceeded):
            await chain.next_subquery(ctx, QUERY, STEPS, "answer multi-hop questions")
        return await chain.final_answer(ctx, QUERY, STEPS, "answer multi-hop questions", passages)

    answer, ctx = one(lm, both, budget=cost + 5)
    assert answer == "Rira" and ctx.meter.usage.total <= cost + 5
    assert lm.requests[-1].max_new_tokens == 128 and lm.requests[-1].temperature == 0.0


# The final answer's documents: the dataset's own context_doc_ids, as the official inference ---------


class RecordingRetriever(WordRetriever):
    def __init__(self, passages):
        super().__init__(passages)
        self.queries = []

    def search(self, queries, k):
        self.queries += [(q, k) for q in queries]
        return super().search(queries, k)


@pytest.fixture(scope="module")
def hotpot_corpus(shared_data, tmp_path_factory):
    """A corpus of the real HotpotQA sample's context paragraphs (row numbers as ids)."""
    from corag.data.corpus import Corpus as ArrowCorpus
    from corag.data.corpus import corpus_from_contexts

    built = corpus_from_contexts(
        [shared_data / "hotpotqa/hotpot_dev_distractor_sample.json"], tmp_path_factory.mktemp("c") / "c.jsonl"
    )
    return built, ArrowCorpus.load(built.path)


def _with_context_ids(example, ids):
    from dataclasses import replace

    return replace(example, meta={**example.meta, "context_doc_ids": ids})


def test_final_answer_reads_exactly_the_datasets_first_20_context_doc_ids(hotpot_corpus):
    from corag.decoding import greedy
    from corag.prompts import final_answer_messages

    built, corpus = hotpot_corpus
    example = built.examples[0]  # "Were Scott Derrickson and Ed Wood of the same nationality?"
    ids = [str(i) for i in range(500, 475, -1)]  # 25 ids, best first; only the first 20 are read
    lm, retriever = EchoLM(" Yes "), RecordingRetriever(list(corpus.iter_batches(1000))[0])
    ex = Executor(lm, retriever)
    [result] = ex.run([greedy(ex.context(), _with_context_ids(example, ids), corpus, max_steps=1)])
    assert result.context_doc_ids == tuple(ids[:20]) and result.context_doc_source == "dataset"
    assert [q for q, _ in retriever.queries] == [result.steps[0].subquery]  # the question was not searched
    final = lm.requests[-1].messages[-1]["content"]
    expected = final_answer_messages(
        example.query, result.steps, "answer multi-hop questions", corpus.get_many(ids[:20]), tok=lm
    )
    assert final == expected[-1]["content"]
    # Doc 19, nearest the question, is the best one; Doc 0 the 20th
    passages = corpus.get_many(ids[:20])
    for i, passage in enumerate(reversed(passages)):
        assert f"Doc {i}: {passage.title}\n" in final
    assert "Doc 20:" not in final and corpus.get(ids[20]).contents[:60] not in final
    assert result.to_record()["context_doc_source"] == "dataset"

    retrieved = EchoLM(" Yes ")
    ex = Executor(retrieved, retriever)
    [searched] = ex.run(
        [greedy(ex.context(), _with_context_ids(example, ids), corpus, max_steps=0, final_docs="retrieve")]
    )
    assert searched.context_doc_source == "retrieved" and retriever.queries[-1] == (example.query, 20)
    assert searched.context_doc_ids == tuple(h.doc_id for h in retriever.search([example.query], 20)[0])


def test_context_doc_ids_outside_the_corpus_fail_before_any_model_call(hotpot_corpus):
    built, corpus = hotpot_corpus
    far = str(len(corpus) + 7)
    examples = [_with_context_ids(built.examples[0], ["3", far]), built.examples[1]]
    with pytest.raises(InputError, match=f"document '{far}' of context_doc_ids is not in the corpus") as err:
        chain.check_dataset_docs(examples, corpus)
    assert (err.value.record, err.value.field) == (built.examples[0].id, "context_doc_ids")
    assert chain.check_dataset_docs(examples, corpus, "retrieve") == 0
    assert chain.check_dataset_docs([_with_context_ids(built.examples[0], ["3"])], corpus) == 1
    with pytest.raises(InputError, match="has no context_doc_ids") as err:
        chain.check_dataset_docs([built.examples[1]], corpus, "dataset")
    assert err.value.record == built.examples[1].id
    with pytest.raises(InputError, match="unknown final_docs"):
        chain.check_dataset_docs([], corpus, "oracle")


# Generation limits on the real checkpoint: a rambling sub-query is cut to its first line --------------

RAMBLING = (
    '"Intermediate query 1: What nationality was Scott Derrickson?"\n'
    "Scott Derrickson is an American director. Ed Wood was also American, so\n\n"
    "Intermediate answer 1: American"
)


class RamblingSubqueries(WrappedLM):
    """The real model for every call but call A, whose output is the constructed multi-line text
    above (charged as the real tokenizer counts it); keeps every generation request."""

    def __init__(self, lm) -> None:
        super().__init__(lm)
        self.requests: list = []

    def generate(self, requests):
        self.requests += requests
        real = [
            r for r in requests if not r.messages[-1]["content"].startswith("You are using a search engine")
        ]
        done = iter(self.lm.generate(real) if real else [])
        return [
            next(done)
            if r in real
            else Completion(
                (RAMBLING,) * r.n,
                Usage(self.lm.count_prompt_tokens(r.messages), self.lm.count_tokens(RAMBLING) + 1, 1),
            )
            for r in requests
        ]


SHORT_PASSAGES = [
    Passage("0", "Scott Derrickson", "Scott Derrickson is an American director."),
    Passage("1", "Ed Wood", "Ed Wood was an American filmmaker."),
    Passage("2", "Doctor Strange", "Doctor Strange is a 2016 film."),
]


def test_a_rambling_subquery_is_cut_to_its_first_line_before_search(smollm2_dir):
    """On the real checkpoint in bfloat16: the rambling call-A output is searched as its first line,
    and every call keeps the limits it was given."""
    from corag.chain import GenerationLimits
    from corag.decoding import greedy
    from corag.lm.hf import HFLM
    from corag.types import Example

    smol = HFLM(smollm2_dir, device="cpu", dtype="bfloat16")
    assert smol.model.dtype == torch.bfloat16
    example = Example("q1", "Were Scott Derrickson and Ed Wood of the same nationality?", ("yes",))
    retriever = RecordingRetriever(SHORT_PASSAGES)
    lm = RamblingSubqueries(smol)
    limits = GenerationLimits(
        subquery_max_new_tokens=48, subanswer_max_new_tokens=6, final_max_new_tokens=5, subanswer_stop=["\n"]
    )
    executor = Executor(lm, retriever)
    run = greedy(executor.context(), example, Corpus(SHORT_PASSAGES), max_steps=1, docs=2, limits=limits)
    (result,) = executor.run([run])
    searched = [q for q, k in retriever.queries if k == 5]
    assert searched == ["What nationality was Scott Derrickson?"] == [s.subquery for s in result.steps]
    subquery, subanswer, final = lm.requests
    assert (subquery.max_new_tokens, subanswer.max_new_tokens, final.max_new_tokens) == (48, 6, 5)
    assert subanswer.stop == ("\n",) and final.stop == ()
    assert result.usage.completion_tokens <= lm.count_tokens(RAMBLING) + 1 + 6 + 5


def test_as_released_takes_calls_as_the_official_agent_and_stop_strings_are_sent():
    from corag.chain import GenerationLimits

    lm = EchoLM(RAMBLING)
    limits = GenerationLimits(as_released=True, subquery_stop=["Intermediate answer"])
    text, _ = one(
        lm, lambda ctx: chain.next_subquery(ctx, QUERY, STEPS, "answer multi-hop questions", limits=limits)
    )
    # the release's cleaning only: the quote opens the text but does not close it, so neither the quote
    # nor the label behind it is removed, and all three lines are searched; without the quote, the label
    # goes and the rest stays
    assert text == RAMBLING and chain.parse_subquery(f"  {RAMBLING[1:]}\n") == RAMBLING[23:]
    assert lm.requests[0].stop == ("Intermediate answer",)
    cut, _ = one(lm, lambda ctx: chain.next_subquery(ctx, QUERY, STEPS, "answer multi-hop questions"))
    assert cut == "What nationality was Scott Derrickson?"
    # sub-answers: kept as generated when as released, stripped by default
    corpus = Corpus([Passage("0", "T", "x")])
    retriever = RecordingRetriever([Passage("0", "T", "x")])
    spaced = EchoLM(" American \n")
    kept, _ = one(spaced, lambda ctx: chain.subanswer(ctx, "q", corpus, k=1, limits=limits), retriever)
    stripped, _ = one(spaced, lambda ctx: chain.subanswer(ctx, "q", corpus, k=1), retriever)
    assert (kept.subanswer, stripped.subanswer) == (" American \n", "American")
