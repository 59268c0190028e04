"""corag.recipes.sft (recipes/sft.py, `corag train sft`) end to end on CPU: LoRA and full fine-tuning, two processes, resume, merge, reload."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from datasets import load_from_disk
from safetensors.torch import load_file
from transformers.utils import is_torch_bf16_gpu_available

from corag.recipes import sft as recipe
from corag.training.dataset import ExamplesConfig

REPO = Path(__file__).resolve().parents[2]
ACCELERATE = Path(sys.executable).parent / "accelerate"


@pytest.fixture(scope="module")
def toy_run(toy_world, toy_dir, tiny_model_dir, tmp_path_factory) -> dict[str, str]:
    """Chains from the toy world's gold decompositions, and the recipe arguments that point at them."""
    out = tmp_path_factory.mktemp("sft")
    with open(out / "chains.jsonl", "w") as f:
        for ex in toy_world.train:
            record = {
                "query_id": ex.id,
                "query": ex.query,
                "answers": list(ex.answers),
                "subqueries": [s.subquery for s in ex.decomposition],
                "subanswers": [s.subanswer for s in ex.decomposition],
                "doc_ids": [list(s.doc_ids) for s in ex.decomposition],
                "context_doc_ids": list(ex.supporting_ids),
                "predictions": ex.answers[0],
            }
            f.write(json.dumps(record) + "\n")
    return {
        "dir": str(out),
        "model_name_or_path": str(tiny_model_dir),
        "chains": str(out / "chains.jsonl"),
        "corpus": str(toy_dir / "corpus.jsonl"),
    }


def launch(
    toy_run: dict, out: Path, *extra: str, accelerate: list[str] | None = None, config: Path | None = None
) -> subprocess.CompletedProcess:
    """Run the recipe with the toy config (or `config`, without chains), as a user would (accelerate launch -m)."""
    args = ["--config", str(config or REPO / "configs/sft/toy.yaml"), "--output_dir", str(out)]
    args += [
        "--learning_rate",
        "1e-3",
        "--save_strategy",
        "steps",
        "--save_steps",
        "200",
        "--save_total_limit",
        "2",
    ]
    for key in ("model_name_or_path",) if config else ("model_name_or_path", "chains", "corpus"):
        args += [f"--{key}", toy_run[key]]
    cmd = [
        str(ACCELERATE),
        "launch",
        *(accelerate or ["--config_file", str(REPO / "configs/accelerate/single.yaml")]),
    ]
    cmd += ["-m", "corag.recipes.sft", *args, "--max_length", "512", "--logging_steps", "1", *extra]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result


def losses(out: Path) -> list[float]:
    state = json.loads((out / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


def decode(model_dir: Path) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from corag.prompts import subquery_messages

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    messages = subquery_messages(
        "Who is the founder of the employer of Pirou Foubin?", [], "answer multi-hop questions"
    )
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :])


# ------------------------------------------------------------------------------------------ config


def test_unknown_config_key_is_named(tmp_path, toy_run, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text((REPO / "configs/sft/toy.yaml").read_text() + "\nlearning_rat: 0.1\n")
    with pytest.raises(SystemExit):
        recipe.parse_args(["--config", str(config)])
    assert "learning_rat" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        recipe.parse_args(["--config", str(REPO / "configs/sft/toy.yaml"), "--no_such_flag", "1"])
    assert "no_such_flag" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name", ["llama3.1-8b-full", "qwen3-8b-full", "llama3.1-8b-kilt-full", "qwen3-4b-lora", "toy"]
)
def test_shipped_configs_parse(name, monkeypatch):
    from corag.config import load_yaml

    monkeypatch.delenv("WORLD_SIZE", raising=False)  # one process: accumulation for 1 GPU

    path = REPO / f"configs/sft/{name}.yaml"
    paths = (
        ["--model_name_or_path", "m", "--dataset", "d"] if name == "toy" else []
    )  # given on the command line
    data, recipe_args, sft, model = recipe.parse_args(["--config", str(path), *paths])
    if name != "toy":  # the paper's settings: 1 epoch, 100 warmup steps, max length 3072 + template
        assert (sft.num_train_epochs, sft.warmup_steps, sft.max_length) == (1, 100, 3200)
        assert load_yaml(path)["bf16"] is True
        assert sft.bf16 == is_torch_bf16_gpu_available()  # fp32 where the device lacks bf16
        assert sft.activation_checkpointing and data.ratio == 0.2
    if name.endswith("8b-full"):  # multi-hop QA: batch 256, lr 5e-6; examples laid end to end, no padding
        assert recipe_args.effective_batch_size == 256 and sft.per_device_train_batch_size == 4
        assert sft.gradient_accumulation_steps == 64  # one process here
        assert recipe.accumulation_steps(256, 4, 8) == 8  # as the paper on 8 GPUs
        assert sft.learning_rate == 5e-6 and sft.padding_free and not sft.packing
        assert sft.ddp_timeout >= 3 * 3600 and data.dataset and data.chains is None
    if name == "llama3.1-8b-kilt-full":  # KILT: batch 1024, lr 1e-5
        assert recipe_args.effective_batch_size == 1024 and sft.gradient_accumulation_steps == 256
        assert recipe.accumulation_steps(1024, 4, 8) == 32
        assert sft.learning_rate == 1e-5 and sft.padding_free and data.dataset.endswith("kilt")
    if "8b" in name and not torch.cuda.is_available():
        assert load_yaml(path)["attn_implementation"] == "flash_attention_2"
        assert model.attn_implementation == "sdpa"  # the CPU fallback
    assert model.use_peft == name.endswith("lora")


@pytest.mark.parametrize("name", ["llama3.1-8b", "qwen3-8b", "llama3.1-8b-kilt"])
def test_shipped_examples_configs_parse(name):
    from corag.config import parse_config
    from corag.training import dataset as examples_dataset

    config = parse_config(
        examples_dataset.ExamplesConfig, ["--config", str(REPO / f"configs/examples/{name}.yaml")]
    )
    assert config.ratio == 0.2 and config.tokenizer.split("/")[1].lower().startswith(name.split("-")[0][:5])
    sft = recipe.parse_args(["--config", str(REPO / f"configs/sft/{name}-full.yaml")])[0]
    assert sft.dataset == config.dataset  # each SFT config trains on what its examples config builds


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU does")
def test_bf16_on_request_trains_on_the_cpu_in_autocast():
    config = str(REPO / "configs/sft/toy.yaml")
    paths = ["--model_name_or_path", "m", "--dataset", "d"]
    _, _, sft, _ = recipe.parse_args(["--config", config, *paths, "--bf16", "true"])
    assert sft.bf16 and sft.use_cpu
    _, _, sft, _ = recipe.parse_args(["--config", config, *paths])
    assert not sft.bf16 and not sft.use_cpu


def test_bad_chain_record_stops_the_recipe(tmp_path, toy_run):
    lines = Path(toy_run["chains"]).read_text().splitlines()
    record = json.loads(lines[1])
    record["subanswers"] = record["subanswers"][:-1]
    bad = tmp_path / "chains.jsonl"
    bad.write_text("\n".join([lines[0], json.dumps(record)]) + "\n")
    data = ExamplesConfig(chains=str(bad), corpus=toy_run["corpus"])
    from corag.errors import InputError

    with pytest.raises(InputError, match=rf"line 2, id '{record['query_id']}', field 'subanswers'"):
        recipe.prepare_examples(data, toy_run["model_name_or_path"], str(tmp_path / "run"))
    assert not (tmp_path / "run-examples").exists() and not (tmp_path / "run").exists()


def test_a_dataset_that_was_not_built_is_named(tmp_path, toy_run):
    from corag.errors import InputError

    data = ExamplesConfig(dataset=str(tmp_path / "nothing"))
    with pytest.raises(InputError, match=r"nothing, field 'dataset': is not an examples dataset"):
        recipe.prepare_examples(data, toy_run["model_name_or_path"], str(tmp_path / "run"))


# ------------------------------------------------------------------------------------------ runs


@pytest.mark.slow
def test_lora_run_learns_resumes_and_merges(toy_run, tmp_path):
    """LoRA with packing: loss falls, every adapter weight moves, an interrupted run resumes from its
    checkpoint to the same final step and weights, and the merged model loads and decodes."""
    out = tmp_path / "lora"
    lora = ["--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0.0"]
    lora += ["--lora_target_modules", "all-linear", "--learning_rate", "5e-3", "--warmup_steps", "0"]
    steps = ["--max_steps", "8", "--save_steps", "4", "--gradient_accumulation_steps", "1"]
    launch(toy_run, out, *lora, *steps, "--merge_lora", "true")

    logged = losses(out)
    assert len(logged) == 8 and sum(logged[-3:]) / 3 < sum(logged[:3]) / 3 - 0.05, logged
    before = load_file(out / "checkpoint-4" / "adapter_model.safetensors")
    after = load_file(out / "adapter_model.safetensors")
    assert before.keys() == after.keys() and len(after) >= 2 * 7 * 2  # A and B of 7 linears x 2 layers
    for name, weight in after.items():
        assert not torch.equal(weight, before[name]), f"{name} did not change"
        if "lora_B" in name:  # LoRA B starts at zero
            assert weight.abs().max() > 0, name

    # Interrupted after checkpoint-4: what a run killed during steps 5-8 leaves behind.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(out / "checkpoint-4", resumed / "checkpoint-4")
    result = launch(toy_run, resumed, *lora, *steps)
    assert "resuming from" in result.stderr
    state = json.loads((resumed / "trainer_state.json").read_text())
    assert state["global_step"] == 8 and [e["step"] for e in state["log_history"] if "loss" in e] == list(
        range(1, 9)
    )
    # Steps 1-4 come from the checkpoint; 5-8 were trained again, exactly as in the uninterrupted run.
    assert losses(resumed) == pytest.approx(logged, rel=1e-4)
    final = load_file(resumed / "adapter_model.safetensors")
    for name, weight in after.items():
        torch.testing.assert_close(final[name], weight, rtol=1e-4, atol=1e-6)

    merged = out / "merged"
    assert not (merged / "adapter_config.json").exists()
    decode(merged)
    from corag.lm.base import GenerationRequest
    from corag.lm.hf import HFLM

    lm = HFLM(merged)
    (completion,) = lm.generate(
        [GenerationRequest(({"role": "user", "content": "Who is Pirou Foubin?"},), 4)]
    )
    assert completion.usage.completion_tokens > 0


@pytest.mark.slow
def test_two_processes_reach_the_loss_of_one_with_the_doubled_batch(toy_run, tmp_path):
    """Full fine-tuning on a dataset built beforehand, padding-free as the 8B configs: two gloo processes on
    CPU (DDP config) with 2 examples each take the same steps as one process with 4 (same examples per step,
    tokens averaged across processes): equal losses within 1e-4 (relative) at each of 3 steps and equal
    weights within 1e-4 (float sums in another order). Nothing is built in the distributed run, and the
    tokens are computed once; the checkpoint reloads and decodes."""
    from corag.training import dataset as examples_dataset

    dataset = tmp_path / "examples"
    built = subprocess.run(
        [str(ACCELERATE.parent / "corag"), "build-examples", "--chains", toy_run["chains"]]
        + [
            "--corpus",
            toy_run["corpus"],
            "--tokenizer",
            toy_run["model_name_or_path"],
            "--dataset",
            str(dataset),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert built.returncode == 0, built.stderr[-3000:]
    manifest = (dataset / examples_dataset.MANIFEST).stat().st_mtime_ns
    common = ["--dataset", str(dataset), "--max_steps", "3", "--save_steps", "100", "--packing", "false"]
    common += ["--padding_free", "true"]  # as the 8B configs (sdpa reads the boundaries on CPU)
    common += ["--gradient_accumulation_steps", "1", "--learning_rate", "1e-3", "--warmup_steps", "0"]
    settings = yaml.safe_load((REPO / "configs/sft/toy.yaml").read_text())
    config = tmp_path / "toy-dataset.yaml"  # the toy config training on the dataset, without chains
    config.write_text(yaml.safe_dump({k: v for k, v in settings.items() if k not in ("chains", "corpus")}))
    one, two = tmp_path / "one", tmp_path / "two"
    launch(toy_run, one, *common, "--per_device_train_batch_size", "4", config=config)
    ddp = ["--config_file", str(REPO / "configs/accelerate/ddp.yaml"), "--num_processes", "2"]
    result = launch(
        toy_run, two, *common, "--per_device_train_batch_size", "2", accelerate=ddp, config=config
    )
    assert "processes: 2" in result.stderr and not re.search(
        r"shard \d+: \d+ chains|tokenize: ", result.stderr
    )
    assert (dataset / examples_dataset.MANIFEST).stat().st_mtime_ns == manifest
    assert (
        not (tmp_path / "two-examples").exists()
        and len([p for p in (dataset / "tokenized").iterdir() if p.is_dir()]) == 1
    )
    assert len(losses(two)) == 3 and losses(two) == pytest.approx(losses(one), rel=1e-4)
    weights_one, weights_two = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    for name, weight in weights_one.items():
        torch.testing.assert_close(weights_two[name], weight, rtol=1e-4, atol=1e-4)
    decode(two)


def test_min_score_trains_only_on_chains_that_reach_it(tmp_path, toy_run):
    from corag.errors import InputError

    lines = Path(toy_run["chains"]).read_text().splitlines()[:4]
    records = [
        {**json.loads(line), "score": s} for line, s in zip(lines, (-0.1, -3.0, -0.5, -8.0), strict=True)
    ]
    chains = tmp_path / "scored.jsonl"
    chains.write_text("".join(json.dumps(r) + "\n" for r in records))
    data = ExamplesConfig(chains=str(chains), corpus=toy_run["corpus"], min_score=-0.69)
    model = toy_run["model_name_or_path"]
    built = load_from_disk(str(recipe.prepare_examples(data, model, str(tmp_path / "a")))).to_list()
    finals = [e["chain_id"] for e in built if e["task"] == "final"]
    assert finals == [records[0]["query_id"], records[2]["query_id"]]
    assert {e["chain_id"] for e in built} == set(finals)
    data.min_score = 0.5
    with pytest.raises(InputError, match=r"scored\.jsonl, field 'min_score'"):
        recipe.prepare_examples(data, model, str(tmp_path / "b"))
    assert not (tmp_path / "b-examples").exists()
    chains.write_text("")
    data.min_score = None
    with pytest.raises(InputError, match=r"scored\.jsonl: holds no chain"):
        recipe.prepare_examples(data, model, str(tmp_path / "c"))


def test_prebuilt_example_files_become_a_dataset_once(tmp_path, toy_run):
    from corag.training import examples as sft

    records = [
        {
            "prompt": [{"role": "user", "content": f"question {i}"}],
            "completion": [{"role": "assistant", "content": f"answer {i}"}],
            "task": "final",
            "id": f"w{i}",
        }
        for i in range(3)
    ]
    jsonl = tmp_path / "warm.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    data, warm = ExamplesConfig(), str(jsonl)
    out = recipe.prepare_examples(data, toy_run["model_name_or_path"], str(tmp_path / "run"), warm)
    assert load_from_disk(str(out)).to_list() == records
    assert recipe.prepare_examples(data, toy_run["model_name_or_path"], str(tmp_path / "run"), warm) == out
    jsonl.write_text(json.dumps({**records[0], "task": "essay"}) + "\n")
    with pytest.raises(sft.InputError, match=r"warm\.jsonl, line 1, id 'w0', field 'task'"):
        recipe.prepare_examples(data, toy_run["model_name_or_path"], str(tmp_path / "other"), warm)


def test_examples_are_reused_only_with_the_same_data_settings(tmp_path, toy_run):
    from corag.errors import InputError

    data = ExamplesConfig(chains=toy_run["chains"], corpus=toy_run["corpus"])
    model, run = toy_run["model_name_or_path"], str(tmp_path / "run")
    built = recipe.prepare_examples(data, model, run)
    assert built == tmp_path / "run-examples"
    assert recipe.prepare_examples(ExamplesConfig(dataset=str(built)), model, run) == built
    assert recipe.prepare_examples(data, model, run) == built
    data.ratio = 0.5
    with pytest.raises(InputError, match=r"other settings \(ratio\)"):
        recipe.prepare_examples(data, model, run)


def test_scoring_only_labelled_positions_keeps_loss_and_gradients(tiny_model_dir, monkeypatch):
    import trl.trainer.utils as trl_utils
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    monkeypatch.setattr(trl_utils, "_use_triton", trl_utils._use_triton)  # restored after the test
    real = trl_utils._ChunkedLogProbFunction
    scored: list[int] = []

    class Counting:  # the rows that reach the LM head, per call
        @staticmethod
        def apply(hidden, *args):
            scored.append(hidden.shape[0])
            return real.apply(hidden, *args)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Counting)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    add_fused_lm_head(model)
    ids = torch.randint(5, 200, (2, 40))
    labels = torch.full_like(ids, -100)
    labels[0, 30:35], labels[1, 10:12] = ids[0, 30:35], ids[1, 10:12]

    def loss_and_grad() -> tuple[float, torch.Tensor]:
        model.zero_grad()
        loss = model(input_ids=ids, labels=labels, fused_lm_head=True).loss
        loss.backward()
        return loss.item(), model.get_input_embeddings().weight.grad.clone()

    assert not trl_utils._use_triton(torch.device("cpu"))
    full_loss, full_grad = loss_and_grad()
    recipe.score_only_labelled_positions()
    assert trl_utils._use_triton(torch.device("cpu"))
    loss, grad = loss_and_grad()
    assert scored == [2 * 39, 5 + 2]  # every shifted position, then only the labelled ones
    assert loss == pytest.approx(full_loss, rel=1e-6)
    assert torch.allclose(grad, full_grad, atol=1e-6)


def test_scoring_only_labelled_positions_fails_loudly_when_trl_changes(monkeypatch):
    import trl.trainer.utils as trl_utils

    monkeypatch.setattr(trl_utils, "add_fused_lm_head", lambda model: None)  # a head that no longer asks
    with pytest.raises(RuntimeError, match=r"trl .* no longer switches its fused LM head"):
        recipe.score_only_labelled_positions()
    monkeypatch.undo()
    monkeypatch.delattr(trl_utils, "_use_triton")
    with pytest.raises(RuntimeError, match="update score_only_labelled_positions"):
        recipe.score_only_labelled_positions()


def test_a_run_resumed_at_its_last_step_trains_no_further_and_saves(toy_run, tmp_path):
    """A run warned at its last step saved checkpoint-2 (max_steps 2) and stopped; requeued, it resumes
    there: no third step (transformers would take one before it checks max_steps), global_step 2 and the
    final model, the checkpoint's weights."""
    steps = ["--max_steps", "2", "--save_steps", "2", "--gradient_accumulation_steps", "1"]
    first = tmp_path / "first"
    launch(toy_run, first, *steps)
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(first / "checkpoint-2", resumed / "checkpoint-2")
    result = launch(toy_run, resumed, *steps)
    assert "resumed at step 2, its max_steps 2: no further step, only the final save" in result.stderr
    assert json.loads((resumed / "trainer_state.json").read_text())["global_step"] == 2
    assert not (resumed / "checkpoint-3").exists()
    final, saved = (
        load_file(resumed / "model.safetensors"),
        load_file(first / "checkpoint-2" / "model.safetensors"),
    )
    assert final.keys() == saved.keys() and all(torch.equal(final[k], saved[k]) for k in saved)
