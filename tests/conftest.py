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
    HF_HOME=str(_RUN_DIR / "hf"),
    WANDB_DIR=str(_RUN_DIR / "wandb"),
    VLLM_CACHE_ROOT=str(_RUN_DIR / "vllm"),
    MPLCONFIGDIR=str(_RUN_DIR / "mpl"),
)

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("CORAG_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real benchmark samples (../shared/data)."""
    assert SHARED_DATA.is_dir(), f"real data samples not found at {SHARED_DATA}"
    return SHARED_DATA


@pytest.fixture(scope="session")
def run_dir() -> Path:
    return _RUN_DIR
