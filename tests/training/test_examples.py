"""Three-task example building and the exact tokens trl trains on (corag/training/examples.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

from corag import prompts
from corag.data.jsonl import write_jsonl
from corag.errors import InputError
from corag.retrieval.bm25 import BM25Retriever
from corag.toy.tinymodel import build_tiny_model
from corag.training import examples as sft

# Chat templates with the structure of the real Llama-3.1 and Qwen3 ones (system block with dates, trimmed
# content and <|eot_id|>; ChatML with an empty think block in the last assistant turn and a newline after
# <|im_end|>). The tokenizers are trained here; the real ones cannot be downloaded.
LLAMA31_TEMPLATE = """{{- bos_token }}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
QWEN3_TEMPLATE = """{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == "user" or message.role == "system" %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""


def family_tokenizer(family: str, texts: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with a Llama-3.1-style or Qwen3-style template and special tokens.

    The Llama one also adds BOS on every encode, as the real one does: the double-BOS trap.
    """
    if family == "llama3.1":
        special = [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ]
    else:
        special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if family == "llama3.1":
        bos = ("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single="<|begin_of_text|> $A", pair="$A $B", special_tokens=[bos]
                ),
            ]
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<|begin_of_text|>",
            eos_token="<|eot_id|>",
            chat_template=LLAMA31_TEMPLATE,
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=QWEN3_TEMPLATE
    )


# ------------------------------------------------------------------------------------------ fixtures


def chain_record(ex, with_docs: bool = True) -> dict:
    """A chain record (corag/multihopqa schema) from a toy question's gold decomposition."""
    record = {
        "query_id": ex.id,
        "query": ex.query,
        "answers": list(ex.answers),
        "subqueries": [s.subquery for s in ex.decomposition],
        "subanswers": [s.subanswer for s in ex.decomposition],
        "predictions": ex.answers[0],
        "context_doc_ids": list(ex.supporting_ids) if with_docs else [],
    }
    if with_docs:
        record["doc_ids"] = [list(s.doc_ids) for s in ex.decomposition]
    return record


@pytest.fixture(scope="module")
def corpus(toy_dir):
    from corag.data.corpus import Corpus

    return Corpus.load(toy_dir / "corpus.jsonl")


@pytest.fixture(scope="module")
def chains(toy_world):
    return [sft.parse_chain(chain_record(ex)) for ex in toy_world.train]


@pytest.fixture(scope="module")
def family_tokenizers(toy_world, tiny_tokenizer) -> dict[str, PreTrainedTokenizerFast]:
    from corag.toy.world import tokenizer_texts

    texts = list(tokenizer_texts(toy_world))
    return {
        "tiny": tiny_tokenizer,
        "llama3.1": family_tokenizer("llama3.1", texts),
        "qwen3": family_tokenizer("qwen3", texts),
    }


@pytest.fixture(scope="module")
def examples(chains, corpus, tiny_tokenizer) -> list[dict]:
    """Every kind of example (ratio 1 keeps all; stop examples from made-up prefix scores)."""
    scores = {c.id: [-3.0 + (i == len(c.steps) - 1) for i in range(len(c.steps) + 1)] for c in chains}
    return sft.build_examples(
        chains[:12],
        corpus,
        truncator=sft.TokenizerTruncator(tiny_tokenizer),
        ratio=1.0,
        stop=True,
        prefix_scores=scores,
    )


def sft_trainer(tokenizer, dataset: Dataset, out: Path, **config) -> SFTTrainer:
    """The trainer the recipe builds, around a tiny model sized to `tokenizer`."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = {"max_length": 1024, **config}
    args = SFTConfig(
        output_dir=str(out),
        report_to="none",
        bf16=False,
        completion_only_loss=True,
        activation_checkpointing=False,
        **config,
    )
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=1, num_heads=1, intermediate_size=128)
    return SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)


# ------------------------------------------------------------------------------------------ bad input


def test_bad_chain_records_name_record_and_field(tmp_path, toy_world):
    good = chain_record(toy_world.train[0])
    mismatch = {**good, "query_id": "q-mismatch", "subanswers": good["subanswers"][:-1]}
    with pytest.raises(InputError, match=r"q-mismatch.*subanswers"):
        sft.parse_chain(mismatch)
    for answers in ([], [""]):
        with pytest.raises(InputError, match=r"q-empty.*answers"):
            sft.parse_chain({**good, "query_id": "q-empty", "answers": answers})
    path = tmp_path / "chains.jsonl"
    path.write_text(
        json.dumps(good) + "\n" + json.dumps({**good, "query_id": "q3", "doc_ids": [["x"]]}) + "\n"
    )
    with pytest.raises(InputError, match=r"chains\.jsonl, line 2, id 'q3', field 'doc_ids'"):
        sft.load_chains(path)


def test_per_step_doc_ids_of_sampled_records_are_read(toy_world):
    good = chain_record(toy_world.train[0], with_docs=False)
    docs = [list(s.doc_ids) for s in toy_world.train[0].decomposition]
    steps = [{"subquery": q, "doc_ids": d} for q, d in zip(good["subqueries"], docs, strict=True)]
    chain = sft.parse_chain({**good, "steps": steps})
    assert [list(s.doc_ids) for s in chain.steps] == docs and all(docs)
    with pytest.raises(InputError, match=r"id 'q4', field 'steps\[1\]\.doc_ids'"):
        bad = [steps[0], {**steps[1], "doc_ids": "d1"}, *steps[2:]]
        sft.parse_chain({**good, "query_id": "q4", "steps": bad})
    with pytest.raises(InputError, match=r"id 'q5', field 'steps': must hold one object per sub-query"):
        sft.parse_chain({**good, "query_id": "q5", "steps": steps[:-1]})


def test_min_score_keeps_only_chains_scored_at_least_it(tmp_path, toy_world):
    scores = [-0.01, -0.69, -0.7, -5.2, None]
    records = [{**chain_record(ex), "score": s} for ex, s in zip(toy_world.train, scores, strict=False)]
    path = tmp_path / "chains.jsonl"
    write_jsonl(path, records[:4])
    assert [c.id for c in sft.load_chains(path)] == [r["query_id"] for r in records[:4]]
    kept = sft.load_chains(path, min_score=-0.69)
    assert [c.id for c in kept] == [records[0]["query_id"], records[1]["query_id"]]
    write_jsonl(path, records)
    assert len(sft.load_chains(path)) == 5  # without min_score a chain needs no score
    with pytest.raises(InputError, match=rf"line 5, id '{records[4]['query_id']}', field 'score'"):
        sft.load_chains(path, min_score=-0.69)


# ------------------------------------------------------------------------------------------ examples


def test_examples_match_the_prompts_and_targets(examples, chains, corpus, tiny_tokenizer):
    by_id = {e["id"]: e for e in examples}
    chain = chains[0]
    task_desc = prompts.task_description(chain.task)
    tok = sft.TokenizerTruncator(tiny_tokenizer)
    for i, step in enumerate(chain.steps):
        sq = by_id[f"{chain.id}/subquery/{i}"]
        assert sq["prompt"] == prompts.subquery_messages(chain.query, chain.steps[:i], task_desc, tok)
        assert sq["completion"] == [{"role": "assistant", "content": step.subquery}]
        sa = by_id[f"{chain.id}/subanswer/{i}"]
        assert sa["prompt"] == prompts.subanswer_messages(step.subquery, corpus.get_many(step.doc_ids), tok)
        assert sa["completion"][0]["content"] == step.subanswer
    final = by_id[f"{chain.id}/final/0"]
    docs = corpus.get_many(chain.context_doc_ids)
    assert final["prompt"] == prompts.final_answer_messages(chain.query, chain.steps, task_desc, docs, tok)
    assert final["completion"][0]["content"] == chain.answers[0]
    # The made-up prefix scores peak at the last prefix but one: "No" before it, "Yes" from it on.
    stops = [
        by_id[f"{chain.id}/stop/{i}"]["completion"][0]["content"] for i in range(1, len(chain.steps) + 1)
    ]
    assert stops == ["No"] * (len(chain.steps) - 2) + ["Yes", "Yes"]


def test_stop_targets_from_prefix_scores():
    assert sft.stop_targets([-3.0, -1.0, -2.0, -0.5]) == ["No", "No", "Yes"]
    assert sft.stop_targets([-0.1, -1.0, -2.0]) == ["Yes", "Yes"]
    assert sft.stop_targets([-2.0, -1.0, -1.0]) == ["Yes", "Yes"]  # ties: the earliest best prefix


def test_ratio_holds_on_a_large_sample(chains, corpus):
    """10k+ sub-query and sub-answer candidates each, kept at 0.2 within 3 sigma; seeded and stable."""
    many = [
        sft.ChainRecord(f"{c.id}-{k}", c.query, c.answers, c.steps, c.context_doc_ids)
        for k in range(60)
        for c in chains
    ]
    n = sum(len(c.steps) for c in many)
    assert n >= 10_000
    built = sft.build_examples(many, corpus, ratio=0.2, seed=7)
    sigma = (n * 0.2 * 0.8) ** 0.5
    for task in ("subquery", "subanswer"):
        kept = sum(e["task"] == task for e in built)
        assert abs(kept - 0.2 * n) < 3 * sigma, (task, kept, n)
    assert sum(e["task"] == "final" for e in built) == len(many)
    again = sft.build_examples(many[:300], corpus, ratio=0.2, seed=7)
    other = sft.build_examples(many[:300], corpus, ratio=0.2, seed=8)
    assert [e["id"] for e in again] == [e["id"] for e in built[: len(again)]]
    assert [e["id"] for e in again] != [e["id"] for e in other]


def test_steps_without_doc_ids_are_re_retrieved(toy_world, corpus):
    records = [sft.parse_chain(chain_record(ex, with_docs=False)) for ex in toy_world.train[:20]]
    with pytest.raises(InputError, match="nothing to re-retrieve them with: set `index`"):
        sft.build_examples(records, corpus, ratio=1.0)
    retriever = BM25Retriever.from_passages(toy_world.passages)
    built = sft.build_examples(records, corpus, retriever=retriever, ratio=1.0)
    for record, ex in zip(records, toy_world.train[:20], strict=True):
        hits = retriever.search([record.query], 20)[0]
        final = next(e for e in built if e["id"] == f"{record.id}/final/0")
        expected = prompts.final_answer_messages(
            record.query,
            record.steps,
            "answer multi-hop questions",
            corpus.get_many([h.doc_id for h in hits]),
        )
        assert final["prompt"] == expected
        for i, step in enumerate(ex.decomposition):
            top5 = [h.doc_id for h in retriever.search([step.subquery], 5)[0]]
            sa = next(e for e in built if e["id"] == f"{record.id}/subanswer/{i}")
            assert sa["prompt"] == prompts.subanswer_messages(step.subquery, corpus.get_many(top5))


@pytest.fixture(scope="module")
def hflm(tiny_model_dir):
    from corag.lm.hf import HFLM

    return HFLM(tiny_model_dir)


def test_truncator_agrees_with_the_hf_backend(hflm, toy_world):
    lm = hflm
    mine = sft.TokenizerTruncator(lm.tokenizer)
    text = " ".join(p.contents for p in toy_world.passages[:20])
    for n, middle in [(184, False), (31, True), (30, True), (10_000, False)]:
        cut = mine.truncate_tokens(text, n, middle=middle)
        assert cut == lm.truncate_tokens(text, n, middle=middle)
        assert lm.count_tokens(cut) <= n


def test_lm_prefix_scores_give_stop_examples(hflm, chains, corpus):
    scorer = sft.lm_prefix_scorer(hflm)
    built = sft.build_examples(chains[:3], corpus, ratio=0.0, stop=True, prefix_scores=scorer)
    scores = scorer(chains[:3])
    for chain, s in zip(chains[:3], scores, strict=True):
        assert len(s) == len(chain.steps) + 1 and all(x < 0 for x in s)
        targets = [e["completion"][0]["content"] for e in built if e["id"].startswith(chain.id + "/stop/")]
        assert targets == sft.stop_targets(s)


def test_jsonl_round_trip(tmp_path, examples):
    path = tmp_path / "x" / "examples.jsonl"
    write_jsonl(path, examples)
    assert sft.load_example_file(path) == examples
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**examples[0], "completion": "Mina"}) + "\n")
    with pytest.raises(InputError, match="completion"):
        sft.load_example_file(bad)
    assert not [p for p in path.parent.iterdir() if p.suffix == ".tmp"]
    ds = sft.to_dataset(examples)
    assert set(ds.column_names) >= {"prompt", "completion", "task"}


# ------------------------------------------------------------------------------------------ tokens


@pytest.mark.parametrize("family", ["tiny", "llama3.1", "qwen3"])
def test_only_target_and_end_of_turn_carry_labels(family, family_tokenizers, examples, tmp_path):
    """Through the recipe's path (our tokenization, trl's preparation and collator), per task."""
    tokenizer = family_tokenizers[family]
    end = {"tiny": "<|end|>", "llama3.1": "<|eot_id|>", "qwen3": "<|im_end|>"}[family]
    sample = [next(e for e in examples if e["task"] == task) for task in sft.TASKS]
    kwargs = {"enable_thinking": False} if family == "qwen3" else None
    dataset = sft.tokenize_dataset(sft.to_dataset(sample), tokenizer, kwargs)
    trainer = sft_trainer(tokenizer, dataset, tmp_path, per_device_train_batch_size=4)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(sample))])
    end_id = tokenizer.convert_tokens_to_ids(end)
    for row, example in enumerate(sample):
        ids, labels = batch["input_ids"][row], batch["labels"][row]
        kept = batch["attention_mask"][row].bool()
        ids, labels = ids[kept].tolist(), labels[kept].tolist()
        target = example["completion"][0]["content"]
        expected = tokenizer(target, add_special_tokens=False)["input_ids"] + [end_id]
        first = next(j for j, label in enumerate(labels) if label != -100)
        assert labels[first:] == expected, (family, example["task"])
        assert all(label == -100 for label in labels[:first])
        assert ids[first:] == expected and ids[-1] == end_id  # nothing after the end of turn
        assert tokenizer.decode(ids[:first]).endswith(
            {"tiny": "<|assistant|>\n", "llama3.1": "<|end_header_id|>\n\n", "qwen3": "</think>\n\n"}[family]
        )
        if tokenizer.bos_token_id is not None:
            assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id


def test_qwen3_default_rendering_keeps_think_block_unlabelled(family_tokenizers, examples):
    """With thinking on by default, the empty think block sits after the generation prompt: still no label."""
    tokenizer = family_tokenizers["qwen3"]
    example = next(e for e in examples if e["task"] == "final")
    out = sft.tokenize_example(tokenizer, example["prompt"], example["completion"])
    labelled = [i for i in out["labels"] if i != -100]
    assert tokenizer.decode(labelled) == example["completion"][0]["content"] + "<|im_end|>"
    assert "<think>\n\n</think>\n\n" + example["completion"][0]["content"] in tokenizer.decode(
        out["input_ids"]
    )


def test_packed_rows_do_not_attend_across_examples(family_tokenizers, examples, tmp_path):
    """trl's BFD packing on CPU (sdpa, padding-free, position_ids): the loss of a packed row equals the
    loss of the same examples padded in one batch, so no example sees another."""
    tokenizer = family_tokenizers["tiny"]
    sample = examples[:6]
    dataset = sft.tokenize_dataset(sft.to_dataset(sample), tokenizer)
    total = sum(len(ids) for ids in dataset["input_ids"])
    packed = sft_trainer(tokenizer, dataset, tmp_path / "p", packing=True, max_length=total)
    padded = sft_trainer(tokenizer, dataset, tmp_path / "q", packing=False, max_length=total)
    padded.model.load_state_dict(packed.model.state_dict())
    assert len(packed.train_dataset) == 1 and sorted(packed.train_dataset[0]["seq_lengths"]) == sorted(
        len(ids) for ids in dataset["input_ids"]
    )
    packed_batch = packed.data_collator([packed.train_dataset[0]])
    padded_batch = padded.data_collator([padded.train_dataset[i] for i in range(len(sample))])
    assert "attention_mask" not in packed_batch and packed_batch["input_ids"].shape == (1, total)
    # The collator masks the first token of each packed sequence; those tokens are prompt tokens anyway.
    assert (packed_batch["labels"] != -100).sum() == (padded_batch["labels"] != -100).sum()
    model = packed.model.eval()
    with torch.no_grad():
        loss_packed = packed.compute_loss(model, dict(packed_batch))
        loss_padded = padded.compute_loss(model, dict(padded_batch))
        forward = {k: v for k, v in packed_batch.items() if k != "labels"}
        logits_packed = model(**forward, use_cache=False).logits[0]
        logits_flat = model(input_ids=packed_batch["input_ids"], use_cache=False).logits[0]
        logits_padded = model(
            input_ids=padded_batch["input_ids"], attention_mask=padded_batch["attention_mask"]
        ).logits
    assert torch.allclose(loss_packed, loss_padded, atol=1e-5)
    # Token by token: each packed segment sees only itself (the same logits as its padded row); without
    # position_ids the row is one long sequence and the logits differ, so this check can fail.
    starts = (packed_batch["position_ids"][0] == 0).nonzero().flatten().tolist() + [total]
    rows = {
        tuple(padded_batch["input_ids"][r][padded_batch["attention_mask"][r].bool()].tolist()): r
        for r in range(6)
    }
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        r = rows[tuple(packed_batch["input_ids"][0, a:b].tolist())]
        assert torch.allclose(logits_packed[a:b], logits_padded[r, : b - a], atol=1e-4)
        if a > 0:
            assert not torch.allclose(logits_flat[a:b], logits_padded[r, : b - a], atol=1e-3)
