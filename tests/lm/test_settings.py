"""Engine settings: from YAML configs and flags of every command to the backend (vLLM's `LLM` seen
through a stand-in module, since vLLM is not installed here); real Qwen3 and Llama-3.1 chat templates
(trl's copies) load and render in every command."""

from __future__ import annotations

import copy
import json
import sys
import types
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
import yaml

from corag.chain import GenerationLimits
from corag.config import parse_config
from corag.errors import InputError
from corag.lm.hf import HFLM
from corag.lm.settings import EngineSettings
from corag.options import chain_settings
from corag.toy.tinymodel import build_tiny_model, save_tiny

REPO = Path(__file__).resolve().parents[2]

TEMPLATES = {  # template file, its special tokens, begin and end-of-turn tokens
    "qwen3": ("qwen3.jinja", ["<|im_start|>", "<|im_end|>"], None, "<|im_end|>"),
    "llama3.1": (
        "llama3_1.jinja",
        ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|begin_of_text|>",
        "<|eot_id|>",
    ),
}


def with_template(tokenizer: Any, kind: str) -> Any:
    """A copy of `tokenizer` with the real chat template of `kind` and its special tokens."""
    name, special, bos, eos = TEMPLATES[kind]
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": special, **({"bos_token": bos} if bos else {})}
    )
    if kind == "qwen3":
        tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.eos_token = eos
    tokenizer.chat_template = (files("trl") / "chat_templates" / name).read_text()
    return tokenizer


@pytest.fixture(scope="module")
def template_models(tiny_tokenizer, tmp_path_factory) -> dict[str, Path]:
    """A tiny random Llama per template, saved with the toy-world tokenizer carrying that template."""
    folders = {}
    for kind in TEMPLATES:
        tokenizer = with_template(tiny_tokenizer, kind)
        model = build_tiny_model(tokenizer, hidden_size=64, num_layers=1, num_heads=1, intermediate_size=128)
        folders[kind] = save_tiny(tmp_path_factory.mktemp(kind), model, tokenizer)
    return folders


@pytest.fixture(scope="module")
def bm25_dir(toy_world, tmp_path_factory) -> Path:
    from corag.retrieval.bm25 import build_bm25_folder

    folder = tmp_path_factory.mktemp("bm25") / "index"
    build_bm25_folder([toy_world.passages], folder)
    return folder


USER = ({"role": "user", "content": "Where was person 5 born?"},)


def test_real_templates_render_prompts_and_locate_scored_targets(template_models) -> None:
    qwen = HFLM(template_models["qwen3"], chat_template_kwargs={"enable_thinking": False}, device="cpu")
    text = qwen.tokenizer.decode(qwen.renderer.prompt_ids(USER))
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and "system" not in text
    ids, start = qwen.renderer.scored_ids(USER, "city 3")
    assert qwen.tokenizer.decode(ids[start:]) == "city 3<|im_end|>"
    with pytest.raises(ValueError, match="enable_thinking"):  # thinking on: no direct answer to score
        HFLM(template_models["qwen3"], chat_template_kwargs={"enable_thinking": True}, device="cpu")
    llama = HFLM(template_models["llama3.1"], device="cpu")
    ids = llama.renderer.prompt_ids(USER)
    text = llama.tokenizer.decode(ids)
    assert ids.count(llama.tokenizer.bos_token_id) == 1 and text.startswith(
        "<|begin_of_text|><|start_header_id|>"
    )
    assert "Cutting Knowledge Date" in text and text.endswith(
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids, start = llama.renderer.scored_ids(USER, "city 3")
    assert llama.tokenizer.decode(ids[start:]) == "city 3<|eot_id|>"


SMALL = ["--subquery-max-new-tokens", "4", "--subanswer-max-new-tokens", "4", "--final-max-new-tokens", "4"]


def command_argv(command: str, model: Path, toy_dir: Path, index: Path, out: Path, kwargs: str) -> list[str]:
    """A one-question run of `command` with tiny generation limits and the template variables."""
    if command == "predict":
        return [
            "--model", str(model), "--data", str(toy_dir / "test.jsonl"), "--corpus", str(toy_dir / "corpus.jsonl"),
            "--retriever", str(index), "--out", str(out / "pred.jsonl"), "--limit", "1", "--max-steps", "1",
            "--device", "cpu", "--chat-template-kwargs", kwargs, *SMALL,
        ]  # fmt: skip
    if command == "evaluate":
        return [
            "--model", str(model), "--data", str(toy_dir / "test.jsonl"), "--corpus", str(toy_dir / "corpus.jsonl"),
            "--retriever", str(index), "--out-dir", str(out / "eval"), "--limit", "1", "--methods", "greedy:L=1",
            "--device", "cpu", "--chat-template-kwargs", kwargs, *SMALL,
        ]  # fmt: skip
    return [
        "--model", str(model), "--questions", str(toy_dir / "train.jsonl"), "--corpus", str(toy_dir / "corpus.jsonl"),
        "--retriever", str(index), "--out_dir", str(out), "--limit", "1", "--num_chains", "1", "--max_length", "1",
        "--block_size", "1", "--device", "cpu", "--chat_template_kwargs", kwargs,
        "--subquery_max_new_tokens", "4", "--subanswer_max_new_tokens", "4",
    ]  # fmt: skip


def command_main(command: str) -> Any:
    from corag.commands import evaluate, predict, sample

    return {"predict": predict.main, "evaluate": evaluate.main, "sample": sample.main}[command]


@pytest.mark.parametrize("command", ["predict", "evaluate", "sample"])
@pytest.mark.parametrize("kind", ["qwen3", "llama3.1"])
def test_every_command_loads_and_runs_both_templates_with_template_variables(
    command, kind, template_models, toy_dir, bm25_dir, tmp_path
) -> None:
    argv = command_argv(
        command, template_models[kind], toy_dir, bm25_dir, tmp_path, '{"enable_thinking": false}'
    )
    assert command_main(command)(argv) == 0
    written = [p for p in tmp_path.rglob("*.jsonl") if p.stat().st_size > 0]
    records = [json.loads(line) for p in written for line in p.read_text().splitlines()]
    assert records and all(r["query_id"] for r in records)
    if kind == "qwen3":  # the variables reach the renderer: thinking on is refused at load
        thinking = command_argv(
            command, template_models[kind], toy_dir, bm25_dir, tmp_path / "on", '{"enable_thinking": true}'
        )
        with pytest.raises(ValueError, match="enable_thinking"):
            command_main(command)(thinking)


# vLLM through a stand-in module ------------------------------------------------------------------------


class EngineBuilt(Exception):
    """Raised by the stand-in `LLM` once it has recorded its arguments."""


@pytest.fixture
def fake_vllm(monkeypatch) -> list[dict[str, Any]]:
    """A `vllm` module whose `LLM` records its arguments and stops the command there."""
    calls: list[dict[str, Any]] = []

    def llm(model: str, **kwargs: Any) -> None:
        calls.append({"model": model, **kwargs})
        raise EngineBuilt

    module = types.ModuleType("vllm")
    module.LLM = llm  # type: ignore[attr-defined]
    module.AsyncEngineArgs = lambda **kwargs: llm(**kwargs)  # type: ignore[attr-defined]
    module.AsyncLLMEngine = None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    return calls


ENGINE = {
    "backend": "vllm",
    "dtype": "bfloat16",
    "tensor_parallel_size": 2,
    "gpu_memory_utilization": 0.55,
    "max_model_len": 4096,
    "max_num_seqs": 48,
    "enable_prefix_caching": False,
    "engine_seed": 11,
    "chat_template_kwargs": {"enable_thinking": False},
}
EXPECTED = {
    "dtype": "bfloat16",
    "tensor_parallel_size": 2,
    "gpu_memory_utilization": 0.55,
    "max_model_len": 4096,
    "max_num_seqs": 48,
    "enable_prefix_caching": False,
    "seed": 11,
}


def test_engine_settings_reach_vllm(fake_vllm, template_models) -> None:
    with pytest.raises(EngineBuilt):
        EngineSettings(**ENGINE).load(str(template_models["qwen3"]))
    with pytest.raises(EngineBuilt):  # the asynchronous engine takes the same arguments
        EngineSettings(**{**ENGINE, "backend": "vllm-async"}).load(str(template_models["qwen3"]))
    offline, asynchronous = fake_vllm[:2]
    assert offline == asynchronous == {"model": str(template_models["qwen3"]), **EXPECTED}
    del fake_vllm[1]
    with pytest.raises(EngineBuilt):  # unset max_num_seqs is left to vLLM
        EngineSettings(backend="vllm").load(str(template_models["llama3.1"]))
    assert "max_num_seqs" not in fake_vllm[1] and fake_vllm[1]["gpu_memory_utilization"] == 0.9


@pytest.mark.parametrize("command", ["predict", "evaluate", "sample"])
def test_every_command_passes_config_and_flags_to_vllm(
    command, fake_vllm, template_models, toy_dir, bm25_dir, tmp_path
) -> None:
    config = tmp_path / "engine.yaml"
    config.write_text(yaml.safe_dump(ENGINE))
    argv = command_argv(
        command, template_models["qwen3"], toy_dir, bm25_dir, tmp_path, '{"enable_thinking": false}'
    )
    flag = "--max_num_seqs" if command == "sample" else "--max-num-seqs"
    with pytest.raises(EngineBuilt):  # the flag overrides the file
        command_main(command)(["--config", str(config), *argv, flag, "7"])
    [call] = fake_vllm
    assert call == {"model": str(template_models["qwen3"]), **EXPECTED, "max_num_seqs": 7}


def test_unknown_or_bad_settings_are_refused(tmp_path) -> None:
    from corag.commands.evaluate import CONFIGS

    config = tmp_path / "bad.yaml"
    config.write_text("gpu_memory_fraction: 0.5\n")
    with pytest.raises(InputError, match="gpu_memory_fraction"):
        parse_config(CONFIGS, ["--config", str(config)])
    with pytest.raises(InputError, match="chat_template_kwargs"):
        EngineSettings(chat_template_kwargs="{enable_thinking: no}")
    for bad in (
        {"dtype": "float8"},
        {"backend": "tpu"},
        {"max_batch_tokens": 0},
        {"gpu_memory_utilization": 1.5},
    ):
        with pytest.raises(InputError, match=next(iter(bad))):
            EngineSettings(**bad).check()
    with pytest.raises(InputError, match="final_max_new_tokens"):
        GenerationLimits(final_max_new_tokens=0).check()


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "eval").glob("*.yaml")))
def test_shipped_evaluation_configs_parse(path: Path) -> None:
    from corag.commands.evaluate import CONFIGS

    _, decoding, args, engine, _ = parse_config(CONFIGS, ["--config", str(path)])
    engine.check()
    assert decoding.model and args.methods
    if path.read_text().startswith("# hardware: CPU"):  # the toy world's, for the simulated cluster run
        assert engine.backend == "hf"
    else:
        assert engine.backend == "vllm-async" and decoding.executor == "async"
    if "qwen3" in path.name:
        assert engine.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "sampling").glob("*.yaml")))
def test_shipped_sampling_configs_parse(path: Path) -> None:
    from corag.commands.sample import CONFIGS

    _, _, engine, _ = parse_config(CONFIGS, ["--config", str(path)])
    engine.check()
    if "qwen3" in path.name:
        assert engine.chat_template_kwargs == {"enable_thinking": False}


def test_chain_settings_hold_only_what_differs_from_the_defaults() -> None:
    assert chain_settings(EngineSettings(dtype="bfloat16", batch_size=3), GenerationLimits()) == {}
    changed = chain_settings(EngineSettings(system_prompt="none"), GenerationLimits(subquery_stop=["\n"]))
    assert changed == {"system_prompt": "none", "subquery_stop": ["\n"]}


def test_engine_settings_reach_the_transformers_backend(template_models) -> None:
    import torch

    settings = EngineSettings(
        dtype="bfloat16",
        device="cpu",
        batch_size=3,
        max_batch_tokens=500,
        max_model_len=256,
        system_prompt="Be brief.",
    )
    lm = settings.load(str(template_models["llama3.1"]))
    assert isinstance(lm, HFLM) and lm.model.dtype == torch.bfloat16
    assert (lm.batch_size, lm.max_batch_tokens, lm.max_context) == (3, 500, 256)
    assert lm.renderer.system_prompt == "Be brief." and lm.renderer.template_kwargs == {}
    assert EngineSettings(device="cpu").load(str(template_models["llama3.1"])).model.dtype == torch.float32
