"""corag.recipes.grpo (recipes/grpo.py, `corag train grpo`): the shipped toy config trains from a checkpoint to a saved model, resumes, and refuses
bad settings in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from corag.recipes import grpo as recipe
from corag.retrieval.bm25 import build_bm25_folder

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def paths(toy_world, toy_dir, tmp_path_factory) -> list[str]:
    index = tmp_path_factory.mktemp("grpo") / "index"
    build_bm25_folder([toy_world.passages], index, num_docs=len(toy_world.passages))
    return ["--questions", str(toy_dir / "train.jsonl"), "--corpus", str(toy_dir / "corpus.jsonl"),
            "--retriever", str(index)]  # fmt: skip


def flags(model: Path, out: Path, paths: list[str], *extra: str) -> list[str]:
    return [
        "--config", str(REPO / "configs/grpo/toy.yaml"), "--model_name_or_path", str(model), "--output_dir", str(out),
        *paths, "--max_steps", "2", "--num_generations", "2", "--per_device_train_batch_size", "2",
        "--max_chain_length", "1", "--save_steps", "1", "--logging_steps", "1", *extra,
    ]  # fmt: skip


def test_the_toy_config_trains_saves_and_resumes(short_model_dir, paths, tmp_path):
    out = tmp_path / "grpo"
    assert recipe.main(flags(short_model_dir, out, paths)) == 0
    AutoModelForCausalLM.from_pretrained(out)  # a checkpoint transformers loads
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert [row["step"] for row in state["log_history"] if "reward" in row] == [1, 2]
    # a rerun with more steps resumes from the last checkpoint instead of starting over
    assert recipe.main(flags(short_model_dir, out, paths, "--max_steps", "3")) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert [row["step"] for row in state["log_history"] if "reward" in row] == [1, 2, 3]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--reward", "bleu"], "reward"),
        (["--scale_rewards", "batch"], "scale_rewards"),
        (["--questions", "missing.jsonl"], "missing.jsonl"),
        (["--time_limit_minutes", "1", "--time_limit_clock", "gpu"], "time_limit_clock"),
    ],
)
def test_bad_settings_are_one_line(short_model_dir, paths, tmp_path, capsys, extra, field):
    with pytest.raises(SystemExit) as exit_:
        recipe.main(flags(short_model_dir, tmp_path / "out", paths, *extra))
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("corag train grpo: error:") and field in err[-1]


@pytest.mark.parametrize("clock", ["wall", "cpu"])
def test_a_time_limit_ends_training_after_the_step_that_passes_it(short_model_dir, paths, tmp_path, clock):
    out = tmp_path / "grpo"
    limit = ["--time_limit_minutes", "0.0001", "--time_limit_clock", clock]
    assert recipe.main(flags(short_model_dir, out, paths, *limit)) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 1  # of max_steps 2
    AutoModelForCausalLM.from_pretrained(out)


def test_the_readme_commands_parse():
    import re
    import shlex

    pages = (REPO / "README.md", REPO / "docs" / "cluster.md")  # the toy run, the cluster's 8B run
    blocks = [b for p in pages for b in re.findall(r"```bash\n(.*?)```", p.read_text(), flags=re.DOTALL)]
    text = "\n".join(blocks).replace("\\\n", " ").replace("corag train grpo", "-m corag.recipes.grpo")
    commands = [
        line.split("-m corag.recipes.grpo")[1] for line in text.splitlines() if "corag.recipes.grpo" in line
    ]
    parsed = [recipe.parse_args(shlex.split(args, comments=True)) for args in commands]
    toy = [p for p in parsed if p[0].questions == "runs/quickstart/world/train.jsonl"]
    data, rollout, _, grpo, model = toy[0]
    assert (data.questions, model.model_name_or_path, grpo.num_generations) == (
        "runs/quickstart/world/train.jsonl", "runs/quickstart/models/corag", 4,
    )  # fmt: skip
    assert rollout.reward == ["f1"] and set(rollout.sampled_calls) == {
        "subquery",
        "subanswer",
        "stop",
        "final",
    }
    assert len(parsed) == 2 and parsed[1][3].use_vllm  # the cluster command: an 8B config on vLLM


@pytest.mark.parametrize("config", ["llama3.1-8b.yaml", "qwen3-8b.yaml", "smollm2-lora.yaml"])
def test_the_shipped_configs_are_settings_the_trainer_takes(config):
    data, rollout, _, grpo, model = recipe.parse_args(["--config", str(REPO / "configs/grpo" / config)])
    assert (grpo.per_device_train_batch_size * grpo.steps_per_generation) % grpo.num_generations == 0
    questions = grpo.generation_batch_size // grpo.num_generations  # a step's questions, on this one process
    assert questions == data.questions_per_step == (2 if config.startswith("smollm2") else 16)
    assert model.model_name_or_path.startswith("runs/sft/")  # after the SFT run
    if config.startswith("smollm2"):
        assert model.use_peft and not grpo.use_vllm and not data.retriever.startswith("http")
    else:  # a node of 8 GPUs: vLLM beside the trainer, the node's retrieval service
        assert grpo.use_vllm and grpo.vllm_mode == "colocate" and data.retriever.startswith("http")
        assert rollout.max_chain_length == 4
