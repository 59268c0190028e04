"""recipes/sft.py with the real checkpoint (SmolLM2-135M-Instruct): a chain sampled by the model over a MiniLM
index of a HotpotQA question's context paragraphs becomes examples; a LoRA fine-tune of a few steps saves an
adapter and merges it; the merged model reloads, equals base plus adapter, and predicts a CoRAG chain."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import load_from_disk
from safetensors.torch import load_file

from corag.data.corpus import Corpus, corpus_from_contexts
from corag.data.formats import load_examples
from corag.decoding.greedy import greedy
from corag.executor import Context, Executor
from corag.lm.base import ScoreRequest
from corag.lm.hf import HFLM
from corag.recipes import sft as recipe
from corag.retrieval.dense import DenseRetriever, Encoder
from corag.sampling import SamplingConfig, sample_question

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hotpot(shared_data, tmp_path_factory):
    """The sample's first question with its two supporting paragraphs and one distractor as the corpus
    (short prompts keep each training step a few seconds on a CPU), and a MiniLM index over them."""
    (example, *_) = load_examples(shared_data / "hotpotqa/hotpot_dev_distractor_sample.json")
    paragraphs = example.meta["paragraphs"]
    kept = [p for p in paragraphs if p["is_supporting"]] + [
        next(p for p in paragraphs if not p["is_supporting"])
    ]
    example = dataclasses.replace(example, meta={**example.meta, "paragraphs": kept})
    out = tmp_path_factory.mktemp("smol-sft")
    built = corpus_from_contexts([example], out / "corpus.jsonl")
    corpus = Corpus.load(built.path)
    passages = [p for batch in corpus.iter_batches(64) for p in batch]
    retriever = DenseRetriever.from_passages(passages, Encoder.from_preset("minilm", device="cpu"))
    return built.examples[0], corpus, built.path, retriever, out


def sample_chain(lm: HFLM, example, corpus, retriever) -> dict:
    """One rejection-sampled chain of one step (the sampling stage's record)."""
    config = SamplingConfig(num_chains=1, min_length=1, max_length=1, top_k=2)
    (record,) = Executor(lm, retriever).run(
        [sample_question(Context(lm, retriever), example, corpus, config)]
    )
    return record


def train(model: Path, chains: Path, corpus: Path, out: Path) -> subprocess.CompletedProcess:
    """One epoch of LoRA (three steps, one example each) with the toy config on the real checkpoint, merged."""
    args = ["--config", str(REPO / "configs/sft/toy.yaml"), "--model_name_or_path", str(model)]
    args += ["--chains", str(chains), "--corpus", str(corpus), "--output_dir", str(out), "--ratio", "1.0"]
    args += ["--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0.0"]
    args += ["--lora_target_modules", "all-linear", "--learning_rate", "2e-3", "--warmup_steps", "0"]
    args += ["--max_steps", "3", "--gradient_accumulation_steps", "1", "--logging_steps", "1"]
    args += ["--save_strategy", "no", "--merge_lora", "true", "--packing", "false", "--max_length", "2048"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    cmd = [sys.executable, str(REPO / "recipes/sft.py"), *args]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result


def test_the_cpu_config_bounds_memory_with_activation_checkpointing():
    """configs/sft/smollm2-lora.yaml: LoRA with activation checkpointing, as measured (6.3 GB -> 3.0 GB)."""
    _, _, sft, model = recipe.parse_args(["--config", str(REPO / "configs/sft/smollm2-lora.yaml")])
    assert model.use_peft and sft.activation_checkpointing and sft.packing
    assert sft.activation_checkpointing_kwargs == {"use_reentrant": False}


@pytest.mark.slow
def test_lora_fine_tune_saves_merges_reloads_and_predicts(smollm2_dir, hotpot):
    example, corpus, corpus_path, retriever, out = hotpot
    base = HFLM(smollm2_dir, device="cpu")
    record = sample_chain(base, example, corpus, retriever)
    assert len(record["subqueries"]) == 1 and len(record["steps"][0]["doc_ids"]) == 2
    chains = out / "chains.jsonl"
    chains.write_text(json.dumps(record) + "\n")

    run = out / "lora"
    train(smollm2_dir, chains, corpus_path, run)
    built = load_from_disk(str(out / "lora-examples")).to_list()  # built from the steps' own doc ids
    assert sorted(e["task"] for e in built) == ["final", "subanswer", "subquery"]
    state = json.loads((run / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    assert all(e["loss"] == e["loss"] and e["loss"] > 0 for e in state["log_history"] if "loss" in e)

    # the adapter: LoRA B starts at zero, so a trained one is non-zero in every layer it touches
    adapter = load_file(run / "adapter_model.safetensors")
    b_weights = [w for name, w in adapter.items() if "lora_B" in name]
    assert len(b_weights) == 7 * 30 and all(w.abs().max() > 0 for w in b_weights)

    # the merged model loads alone, computes what base plus adapter computes, and differs from the base
    merged = run / "merged"
    assert (merged / "model.safetensors").exists() and not (merged / "adapter_config.json").exists()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    final = next(e for e in built if e["task"] == "final")
    request = ScoreRequest(tuple(final["prompt"]), final["completion"][0]["content"])
    ids = torch.tensor([base.renderer.prompt_ids(built[0]["prompt"])])  # the shortest prompt
    with torch.no_grad():
        base_logits = base.model(ids).logits
        (before,) = base.score([request])
        fresh = AutoModelForCausalLM.from_pretrained(smollm2_dir)
        via_adapter = PeftModel.from_pretrained(fresh, run).eval()(ids).logits
        tuned = HFLM(merged, device="cpu")
        merged_logits = tuned.model(ids).logits
    torch.testing.assert_close(merged_logits, via_adapter, rtol=1e-4, atol=1e-3)
    assert (merged_logits - base_logits).abs().max() > 1e-2

    # one epoch on these examples raises the likelihood of the trained final answer
    (after,) = tuned.score([request])
    assert after.mean > before.mean

    # and the merged model runs a CoRAG chain on the question
    executor = Executor(tuned, retriever)
    (result,) = executor.run([greedy(executor.context(), example, corpus, max_steps=1, docs=2)])
    assert len(result.steps) == 1 and isinstance(result.prediction, str)
    assert result.usage.calls == 3 and result.usage.completion_tokens > 0
