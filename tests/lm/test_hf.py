"""The transformers backend against plain transformers: scores, greedy decoding, batching, seeds, usage."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tokenizers.processors import TemplateProcessing
from transformers import AutoModelForCausalLM, AutoTokenizer

from corag.errors import InputError
from corag.lm import load_lm
from corag.lm.base import GenerationRequest, ScoreRequest
from corag.lm.hf import HFLM
from corag.lm.render import ChatRenderer
from corag.lm.settings import EngineSettings
from corag.toy.tinymodel import CHAT_TEMPLATE, build_tiny_model, save_tiny, train_tokenizer

TEXTS = [
    f"The director of film {i} is person {i * 7 % 13}, who was born in city {i % 5} of country {i % 3}."
    for i in range(200)
]


def chat(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


PROMPTS = [
    chat("Who is the director of film 3?"),
    chat("Where was person 5 born?"),
    ({"role": "system", "content": "Answer briefly."}, *chat("In which country is city 2 of country 1?")),
    chat("Film 12"),
]


def lively_model(tokenizer):
    """A tiny Llama whose random output layer is sharp enough that texts vary with the context and
    the end-of-turn token wins now and then (a fresh init only repeats its last token)."""
    model = build_tiny_model(tokenizer, hidden_size=64, num_heads=1, intermediate_size=128)
    weight = torch.randn(model.lm_head.weight.shape, generator=torch.Generator().manual_seed(0)) * 0.3
    weight[tokenizer.eos_token_id] *= 2
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(weight)
    return model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = train_tokenizer(TEXTS, vocab_size=400)
    return save_tiny(tmp_path_factory.mktemp("tiny-lm"), lively_model(tokenizer), tokenizer)


@pytest.fixture(scope="module")
def lm(model_dir: Path) -> HFLM:
    return HFLM(model_dir, batch_size=3)


@pytest.fixture(scope="module")
def reference(model_dir: Path):
    """The same checkpoint loaded by plain transformers, for hand-computed expectations."""
    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def prompt_ids(tokenizer, messages) -> list[int]:
    return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, return_dict=True)[
        "input_ids"
    ]


def test_load_lm_builds_the_hf_backend_and_rejects_unknown_backends(model_dir: Path) -> None:
    lm = load_lm(model_dir)
    assert isinstance(lm, HFLM)
    assert lm.max_batch_tokens == EngineSettings().max_batch_tokens  # bounded as the commands are
    with pytest.raises(ValueError, match="unknown LM backend"):
        load_lm(model_dir, backend="nope")


def test_score_equals_log_softmax_of_a_plain_forward(lm: HFLM, reference) -> None:
    model, tokenizer = reference
    requests = [
        ScoreRequest(m, t) for m, t in zip(PROMPTS, ["person 3", "city 4", "country 0", ""], strict=True)
    ]
    scores = lm.score(requests)
    for request, score in zip(requests, scores, strict=True):
        # The template's generation mask marks the assistant content and its end token.
        rendered = tokenizer.apply_chat_template(
            [*request.messages, {"role": "assistant", "content": request.target}],
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        ids, mask = rendered["input_ids"], rendered["assistant_masks"]
        positions = [i for i, m in enumerate(mask) if m]
        with torch.no_grad():
            logprobs = model(torch.tensor([ids])).logits[0].log_softmax(-1)
        expected = [logprobs[p - 1, ids[p]].item() for p in positions]
        assert len(score.logprobs) == len(expected) == len(tokenizer.encode(request.target)) + 1
        assert score.logprobs == pytest.approx(expected, abs=1e-4)
        assert score.prompt_ids + score.token_ids == tuple(ids[: positions[-1] + 1])
        assert len(score.token_ids) == len(score.logprobs)
        assert score.usage.prompt_tokens == positions[-1] + 1 == lm.count_score_tokens(request)
        assert (score.usage.completion_tokens, score.usage.calls) == (0, 1)
    # At a temperature, the logits are divided by it first (the learned stop's sampled decision).
    (hot,) = lm.score([ScoreRequest(requests[0].messages, requests[0].target, 2.0)])
    ids = hot.prompt_ids + hot.token_ids
    with torch.no_grad():
        logprobs = (model(torch.tensor([ids])).logits[0] / 2.0).log_softmax(-1)
    start = len(hot.prompt_ids)
    assert hot.logprobs == pytest.approx(
        [logprobs[p - 1, ids[p]].item() for p in range(start, len(ids))], abs=1e-4
    )


def test_greedy_equals_transformers_generate(lm: HFLM, reference) -> None:
    model, tokenizer = reference
    endings = []
    for messages in PROMPTS:
        ids = prompt_ids(tokenizer, messages)
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids) :].tolist()
        ended = tokenizer.eos_token_id in out
        endings.append(ended)
        new = out[: out.index(tokenizer.eos_token_id) + 1] if ended else out
        [completion] = lm.generate([GenerationRequest(messages, max_new_tokens=12)])
        assert completion.texts == (tokenizer.decode(new, skip_special_tokens=True),)
        assert completion.usage.prompt_tokens == len(ids) == lm.count_prompt_tokens(messages)
        assert completion.usage.completion_tokens == len(new)
        assert completion.usage.calls == 1
    assert any(endings) and not all(endings), "the prompts should cover both ways of stopping"


def mixed_requests() -> list[GenerationRequest]:
    return [
        GenerationRequest(PROMPTS[0], max_new_tokens=10),
        GenerationRequest(PROMPTS[1], max_new_tokens=7, temperature=0.8, n=2, seed=11),
        GenerationRequest(PROMPTS[2], max_new_tokens=12, temperature=1.0, n=3, seed=5),
        GenerationRequest(PROMPTS[3], max_new_tokens=4, n=2),
        GenerationRequest(PROMPTS[0], max_new_tokens=9, temperature=1.3, seed=11),
    ]


def test_batched_outputs_equal_one_at_a_time(lm: HFLM) -> None:
    requests = mixed_requests()
    batched = lm.generate(requests)
    alone = [lm.generate([r])[0] for r in requests]
    assert batched == alone
    assert [len(c.texts) for c in batched] == [r.n for r in requests]


def test_seeds_fix_samples_and_different_seeds_differ(lm: HFLM) -> None:
    def sample(seed: int) -> tuple[str, ...]:
        request = GenerationRequest(PROMPTS[1], max_new_tokens=12, temperature=1.0, n=4, seed=seed)
        return lm.generate([request])[0].texts

    first = sample(1)
    assert sample(1) == first
    assert sample(2) != first
    assert len(set(first)) > 1, "the n samples of one request should differ"


def test_n_samples_charge_the_prompt_once_and_every_sample(lm: HFLM) -> None:
    request = GenerationRequest(PROMPTS[2], max_new_tokens=5, temperature=1.0, n=3, seed=0)
    [completion] = lm.generate([request])
    assert len(completion.texts) == 3
    assert completion.usage.prompt_tokens == lm.count_prompt_tokens(PROMPTS[2])
    assert 3 <= completion.usage.completion_tokens <= 15
    [greedy] = lm.generate([GenerationRequest(PROMPTS[2], max_new_tokens=5, n=2)])
    [single] = lm.generate([GenerationRequest(PROMPTS[2], max_new_tokens=5)])
    assert greedy.texts == single.texts * 2
    assert greedy.usage.completion_tokens == 2 * single.usage.completion_tokens
    assert greedy.usage.prompt_tokens == single.usage.prompt_tokens


def test_stop_strings_cut_the_text_and_the_charge(lm: HFLM, reference) -> None:
    model, tokenizer = reference
    ids = prompt_ids(tokenizer, PROMPTS[0])
    out = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)[0, len(ids) :].tolist()
    if tokenizer.eos_token_id in out:
        out = out[: out.index(tokenizer.eos_token_id)]
    text = tokenizer.decode(out)
    assert len(text) >= 6, "the tiny model should write a few characters before ending"
    stop = text[3:6]
    # The charge stops at the first token whose text completes the stop string.
    stopped_at = next(k for k in range(1, len(out) + 1) if stop in tokenizer.decode(out[:k]))
    [completion] = lm.generate([GenerationRequest(PROMPTS[0], max_new_tokens=20, stop=("@@", stop))])
    assert completion.texts == (text[: text.index(stop)],)
    assert completion.usage.completion_tokens == stopped_at


def test_too_long_prompts_fail_clearly_and_new_tokens_are_capped(model_dir: Path, lm: HFLM) -> None:
    prompt = lm.count_prompt_tokens(PROMPTS[2])
    small = HFLM(model_dir, max_context=prompt + 3)
    assert small.max_context == prompt + 3
    [completion] = small.generate([GenerationRequest(PROMPTS[2], max_new_tokens=50, temperature=1.0, seed=0)])
    assert completion.usage.completion_tokens <= 3
    tiny = HFLM(model_dir, max_context=prompt - 1)
    with pytest.raises(ValueError, match=f"prompt of {prompt} tokens .* context of {prompt - 1} tokens"):
        tiny.generate([GenerationRequest(PROMPTS[2])])
    with pytest.raises(ValueError, match="context of"):
        tiny.score([ScoreRequest(PROMPTS[2], "city 1")])


def test_max_context_comes_from_config_and_tokenizer(lm: HFLM, reference) -> None:
    model, tokenizer = reference
    assert lm.max_context == min(model.config.max_position_embeddings, tokenizer.model_max_length)


def test_a_tokenizer_without_chat_template_is_refused(model_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = None
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    plain = save_tiny(tmp_path / "no-template", model, tokenizer)
    with pytest.raises(InputError, match="no-template.*chat template"):
        HFLM(plain)


def test_counting_and_truncation(lm: HFLM, reference) -> None:
    _, tokenizer = reference
    text = " ".join(TEXTS[:5])
    ids = tokenizer.encode(text)
    assert lm.count_tokens(text) == len(ids)
    assert lm.truncate_tokens(text, len(ids)) == text
    assert lm.truncate_tokens(text, 10) == tokenizer.decode(ids[:10])
    middle = lm.truncate_tokens(text, 10, middle=True)
    assert middle == tokenizer.decode(ids[:5] + ids[-5:])
    assert middle.startswith(tokenizer.decode(ids[:5])) and middle.endswith(tokenizer.decode(ids[-5:]))


def test_a_begin_token_in_the_template_is_not_doubled() -> None:
    tokenizer = train_tokenizer(TEXTS[:50], vocab_size=300)
    tokenizer.add_special_tokens({"bos_token": "<|begin|>"})
    bos = tokenizer.bos_token_id
    # Like Llama-3: the tokenizer adds a begin token itself, and the template writes one too.
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|begin|> $A", special_tokens=[("<|begin|>", bos)]
    )
    tokenizer.chat_template = "{{ bos_token }}" + CHAT_TEMPLATE
    assert tokenizer("x")["input_ids"][0] == bos
    renderer = ChatRenderer(tokenizer)
    ids = renderer.prompt_ids(PROMPTS[0])
    assert ids[0] == bos and ids.count(bos) == 1
    scored, start = renderer.scored_ids(PROMPTS[0], "person 3")
    assert scored.count(bos) == 1 and scored[:start] == ids
    assert tokenizer.decode(scored[start:]) == "person 3<|end|>"


def test_scores_are_probabilities_of_the_target(lm: HFLM) -> None:
    [score] = lm.score([ScoreRequest(PROMPTS[0], "person 3")])
    assert all(lp < 0 for lp in score.logprobs)
    assert math.isclose(score.mean, sum(score.logprobs) / len(score.logprobs))


THINKING_TEMPLATE = (  # in the manner of Qwen3: an empty thinking block opens the assistant turn
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n<think>\n\n</think>\n\n' + message['content'] + '<|end|>\n' }}"
    "{% else %}{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)


def test_template_arguments_reach_the_template() -> None:
    tokenizer = train_tokenizer(TEXTS[:50], vocab_size=300)
    tokenizer.chat_template = THINKING_TEMPLATE
    with pytest.raises(ValueError, match="enable_thinking"):
        ChatRenderer(tokenizer, template_kwargs={"enable_thinking": True})
    assert ChatRenderer(tokenizer).template_kwargs == {"enable_thinking": False}  # the switch's default
    renderer = ChatRenderer(tokenizer, template_kwargs={"enable_thinking": False})
    scored, start = renderer.scored_ids(PROMPTS[0], "person 3")
    assert scored[:start] == renderer.prompt_ids(PROMPTS[0])
    assert tokenizer.decode(scored[start:]) == "person 3<|end|>"
    assert tokenizer.decode(renderer.prompt_ids(PROMPTS[0])).endswith("</think>\n\n")


def test_a_loaded_qwen2_model_generates_like_transformers() -> None:
    tokenizer = train_tokenizer(TEXTS[:50], vocab_size=300)
    model = build_tiny_model(tokenizer, arch="qwen2", hidden_size=64, num_heads=1, intermediate_size=128)
    lm = HFLM(model, tokenizer, dtype="float32", batch_size=2)
    ids = prompt_ids(tokenizer, PROMPTS[1])
    out = model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)[0, len(ids) :].tolist()
    requests = [GenerationRequest(m, max_new_tokens=6) for m in PROMPTS]
    completions = lm.generate(requests)
    assert completions[1].texts == (tokenizer.decode(out, skip_special_tokens=True),)
    assert completions == [lm.generate([r])[0] for r in requests]
    with pytest.raises(ValueError, match="unknown dtype"):
        HFLM(model, tokenizer, dtype="float8")


def test_stop_strings_are_looked_for_in_the_newest_tokens_only(lm: HFLM, monkeypatch) -> None:
    from corag.lm.hf import STOP_MARGIN

    stops = ("\x00", "~~")  # never written: every step looks
    requests = [GenerationRequest(m, max_new_tokens=30, temperature=1.0, seed=3, stop=stops) for m in PROMPTS]
    [expected] = max((lm.generate([r]) for r in requests), key=lambda c: c[0].usage.completion_tokens)
    request = requests[[lm.generate([r])[0] for r in requests].index(expected)]
    assert expected.usage.completion_tokens > 2 + STOP_MARGIN, "a long enough generation to see windows"
    decoded: list[int] = []
    original = lm.tokenizer.decode
    monkeypatch.setattr(
        lm.tokenizer, "decode", lambda ids, **kw: decoded.append(len(ids)) or original(ids, **kw)
    )
    assert lm.generate([request]) == [expected]
    *during, final = decoded  # one window per new token, then the finished text in full
    assert len(during) == expected.usage.completion_tokens
    assert max(during) == 2 + STOP_MARGIN and final == expected.usage.completion_tokens


class PassSizes:
    """Records rows x length of the attention mask of every forward pass (prompt and cache together)."""

    def __init__(self, model) -> None:
        self.sizes: list[tuple[int, int]] = []
        self.handle = model.register_forward_pre_hook(self.record, with_kwargs=True)

    def record(self, module, args, kwargs) -> None:
        self.sizes.append(tuple(kwargs["attention_mask"].shape))


@pytest.fixture(scope="module")
def smol(smollm2_dir: Path) -> HFLM:
    return HFLM(smollm2_dir, device="cpu", system_prompt="none")


QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Hamlet?",
    "Name a planet.",
    "Which river flows through Cairo, the largest city of Egypt and of the Arab world?",
    "What colour is the sky on a clear day at noon?",
    "How many legs does a spider have?",
]


def test_the_token_limit_bounds_every_forward_pass_of_the_real_checkpoint(smol: HFLM) -> None:
    requests = [GenerationRequest(chat(q), max_new_tokens=5) for q in QUESTIONS]
    scores = [ScoreRequest(chat(q), "I do not know.") for q in QUESTIONS]
    free = smol.generate(requests), smol.score(scores)
    limit = 2 * max(smol.count_prompt_tokens(chat(q)) for q in QUESTIONS) + 10
    limited = HFLM(smol.model, smol.tokenizer, batch_size=64, max_batch_tokens=limit, system_prompt="none")
    passes = PassSizes(smol.model)
    try:
        bounded = limited.generate(requests), limited.score(scores)
    finally:
        passes.handle.remove()
    assert all(rows * length <= limit for rows, length in passes.sizes)
    assert max(rows for rows, _ in passes.sizes) >= 2  # batches still form under the limit
    assert bounded[0] == free[0]
    for a, b in zip(bounded[1], free[1], strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_bfloat16_generates_and_scores_like_float32(smollm2_dir: Path, smol: HFLM) -> None:
    half = HFLM(smollm2_dir, device="cpu", dtype="bfloat16", system_prompt="none")
    assert half.model.dtype == torch.bfloat16 and smol.model.dtype == torch.float32
    question = chat("What is the capital of France?")
    [completion] = half.generate([GenerationRequest(question, max_new_tokens=8)])
    assert "Paris" in completion.texts[0]
    [low], [full] = (
        half.score([ScoreRequest(question, "Paris")]),
        smol.score([ScoreRequest(question, "Paris")]),
    )
    assert abs(low.mean - full.mean) < 0.25 and math.isfinite(low.mean)


def test_a_final_assistant_message_is_continued(lm: HFLM, reference) -> None:
    model, tokenizer = reference
    start = "The director of film 3 is"
    messages = (*chat("Who is the director of film 3?"), {"role": "assistant", "content": start})
    text = tokenizer.decode(lm.renderer.prompt_ids(messages))
    opened = tokenizer.decode(prompt_ids(tokenizer, messages[:1]))
    assert text == opened + start  # the reply's start, its turn left open (no end-of-turn after it)
    ids = list(lm.renderer.prompt_ids(messages))
    out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids) :].tolist()
    out = out[: out.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in out else out
    [completion] = lm.generate([GenerationRequest(messages, max_new_tokens=8)])
    assert completion.texts == (tokenizer.decode(out, skip_special_tokens=True),)
    assert completion.usage.prompt_tokens == len(ids) == lm.count_prompt_tokens(messages)
