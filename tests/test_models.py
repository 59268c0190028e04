"""The packaged real checkpoint (SmolLM2-135M-Instruct): its conversion, and the CoRAG calls through its
ChatML template, scoring against a log-softmax by hand, and one greedy step on a real HotpotQA question."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from corag.chain import GenerationLimits
from corag.data.corpus import Corpus, corpus_from_contexts
from corag.data.formats import load_examples
from corag.decoding.greedy import greedy
from corag.executor import Executor
from corag.lm.base import ScoreRequest, WrappedLM
from corag.lm.hf import HFLM
from corag.models import SOURCE_RECORD, convert_smollm2, smollm2_gguf
from corag.prompts import final_answer_messages, subanswer_messages, subquery_messages
from corag.retrieval.dense import DenseRetriever, Encoder
from corag.types import Passage, Step

# The template's own default system turn, added to every call (no system message is passed).
CHATML_PREFIX = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
)


@pytest.fixture(scope="module")
def smol(smollm2_dir) -> HFLM:
    return HFLM(smollm2_dir, device="cpu")


def test_conversion_records_its_source_and_is_reused(smollm2_dir):
    record = json.loads((smollm2_dir / SOURCE_RECORD).read_text())
    assert record["sha256"] == hashlib.sha256(smollm2_gguf().read_bytes()).hexdigest()
    assert record["source"].endswith(".gguf")
    weights = smollm2_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert convert_smollm2(smollm2_dir) == smollm2_dir
    assert weights.stat().st_mtime_ns == before  # the same file: nothing rewritten
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config


def test_the_three_calls_render_as_chatml_and_generation_stops_at_the_end_of_turn(smol):
    query = "Were Scott Derrickson and Ed Wood of the same nationality?"
    steps = [Step("What is the nationality of Scott Derrickson?", "American")]
    docs = [Passage("0", "Ed Wood", "Edward Davis Wood Jr. was an American filmmaker.")]
    calls = [
        subquery_messages(query, steps, "answer multi-hop questions"),
        subanswer_messages("What is the nationality of Ed Wood?", docs),
        final_answer_messages(query, steps, "answer multi-hop questions", docs),
    ]
    for messages in calls:
        (message,) = messages
        rendered = smol.tokenizer.decode(smol.renderer.prompt_ids(messages))
        assert (
            rendered
            == f"{CHATML_PREFIX}<|im_start|>user\n{message['content']}<|im_end|>\n<|im_start|>assistant\n"
        )

    from corag.lm.base import GenerationRequest

    request = GenerationRequest(
        ({"role": "user", "content": "What is the capital of France?"},), max_new_tokens=40
    )
    (completion,) = smol.generate([request])
    (text,) = completion.texts
    assert "<|im_end|>" not in text and "Paris" in text
    end = smol.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert end in smol.end_ids
    # the text's tokens plus the end-of-turn token: generation stopped there, well before 40
    assert completion.usage.completion_tokens == len(smol.renderer.encode(text)) + 1 < 40


def test_score_equals_a_log_softmax_computed_by_hand(smol):
    messages = subanswer_messages(
        "Who directed Ed Wood?",
        [Passage("0", "Ed Wood (film)", "Ed Wood is a 1994 film directed by Tim Burton.")],
    )
    target = "Tim Burton"
    (score,) = smol.score([ScoreRequest(tuple(messages), target)])
    prompt = smol.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    end = smol.tokenizer.convert_tokens_to_ids("<|im_end|>")
    target_ids = smol.tokenizer(target, add_special_tokens=False)["input_ids"] + [end]
    full = list(prompt) + target_ids
    with torch.no_grad():
        logits = smol.model(torch.tensor([full])).logits[0].float()
    logprobs = logits.log_softmax(-1)
    expected = [float(logprobs[len(prompt) - 1 + j, t]) for j, t in enumerate(target_ids)]
    assert score.logprobs == pytest.approx(expected, abs=1e-4)
    assert score.usage.prompt_tokens == len(full)


class Recorder(WrappedLM):
    """Keeps every generation request and what it returned."""

    def __init__(self, lm) -> None:
        super().__init__(lm)
        self.calls: list = []

    def generate(self, requests):
        completions = self.lm.generate(requests)
        self.calls += list(zip(requests, completions, strict=True))
        return completions


def test_one_greedy_step_on_a_real_hotpotqa_question_is_metered_exactly(smol, shared_data, tmp_path):
    # the first question with its own ten paragraphs as the corpus (MiniLM encodes the whole sample's
    # thousand paragraphs in a minute and a half on two cores; the step needs only its question's)
    first = load_examples(shared_data / "hotpotqa/hotpot_dev_distractor_sample.json")[0]
    built = corpus_from_contexts([first], tmp_path / "c.jsonl")
    corpus = Corpus.load(built.path)
    passages = [p for batch in corpus.iter_batches(512) for p in batch]
    retriever = DenseRetriever.from_passages(passages, Encoder.from_preset("minilm", device="cpu"))
    example = built.examples[0]
    lm = Recorder(smol)
    executor = Executor(lm, retriever)
    # five final-answer documents instead of 20, and 24 new tokens a call, keep the calls short on a CPU
    limits = GenerationLimits(24, 24, 24)
    (result,) = executor.run(
        [greedy(executor.context(), example, corpus, max_steps=1, docs=5, limits=limits)]
    )

    assert len(result.steps) == 1 and len(result.context_doc_ids) == 5 and isinstance(result.prediction, str)
    assert [len(r.messages) for r, _ in lm.calls] == [1, 1, 1]  # sub-query, sub-answer, final answer
    # every token counted from the tokenizer itself: prompts as rendered, and each generated text
    # plus its end-of-turn token (or the cap it was cut at)
    prompts = sum(
        len(
            smol.tokenizer.apply_chat_template(
                list(r.messages), add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for r, _ in lm.calls
    )
    generated = 0
    for request, completion in lm.calls:
        tokens = len(smol.renderer.encode(completion.texts[0]))
        generated += request.max_new_tokens if tokens >= request.max_new_tokens else tokens + 1
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.calls) == (
        prompts,
        generated,
        3,
    )
