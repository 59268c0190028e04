"""GRPO rollouts on vLLM (trl's colocated engine, corag/training/grpo.py): the trainer takes steps with
chains sampled by the engine, and after each step the engine answers as the trained policy does.

Runs where vllm is installed (tests/vllm/run.sh builds such an environment on CPU); skipped elsewhere.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
pytest.importorskip("vllm")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from corag.data.corpus import Corpus  # noqa: E402
from corag.lm.base import GenerationRequest  # noqa: E402
from corag.lm.hf import HFLM  # noqa: E402
from corag.lm.vllm import VLLMLM  # noqa: E402
from corag.retrieval.dense import DenseRetriever, Encoder  # noqa: E402
from corag.training.grpo import ChainGRPOTrainer  # noqa: E402
from corag.training.rollout import RolloutConfig  # noqa: E402


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_colocated_vllm_rollouts_train_and_follow_the_policy(
    toy_world, toy_dir, short_model_dir, tmp_path, lora
):
    """One engine per process: tests/vllm/run.sh runs each case in its own."""
    from peft import LoraConfig

    config = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        num_generations=2,
        per_device_train_batch_size=2,
        max_steps=2,
        learning_rate=3e-2,  # large enough that the steps change what the model answers
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=True,
        seed=0,
        temperature=0.7,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_importance_sampling_correction=False,
        vllm_max_model_length=2048,
    )
    model = AutoModelForCausalLM.from_pretrained(short_model_dir)
    assert model.config.tie_word_embeddings  # the engine's own output layer must follow the embeddings
    trainer = ChainGRPOTrainer(
        model=model,
        processing_class=AutoTokenizer.from_pretrained(short_model_dir),
        args=config,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear") if lora else None,
        questions=toy_world.train[:4],
        corpus=Corpus.load(toy_dir / "corpus.jsonl"),
        # MiniLM, not BM25: bm25s imports numba, whose llvmlite objects break vllm-cpu 0.32's start-up
        # scan of loaded modules (register_triton_kernel_overrides); GPU builds do not run that scan.
        retriever=DenseRetriever.from_passages(
            toy_world.passages, Encoder.from_preset("minilm", device="cpu")
        ),
        rollout_config=RolloutConfig(max_chain_length=1, reward=["f1", "-0.5*tokens"]),
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    tokens = [row["tokens_per_chain"] for row in trainer.state.log_history if "tokens_per_chain" in row]
    assert len(tokens) == 2 and all(t > 0 for t in tokens)

    # The engine, synced after the last step, answers greedily as the trained model does.
    questions = [({"role": "user", "content": q.query},) for q in toy_world.test[:6]]
    requests = [GenerationRequest(messages, max_new_tokens=12) for messages in questions]
    engine = trainer.policy_lm()
    assert isinstance(engine, VLLMLM) and trainer._last_loaded_step == trainer.state.global_step == 2
    policy = trainer.model.merge_and_unload() if lora else trainer.model  # what the engine was given
    trained = HFLM(policy, trainer.processing_class).generate(requests)
    assert engine.generate(requests) == trained
    assert HFLM(short_model_dir).generate(requests) != trained  # the steps changed the answers
