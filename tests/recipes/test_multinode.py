"""Training on many nodes: the effective batch and GRPO's questions a step whatever the GPU count, W&B
without a key or network, and
the Slurm script's command lines on 2 nodes (stub srun, scontrol and accelerate that record their argv),
for SFT and for GRPO with each node's own retrieval service."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corag.errors import InputError
from corag.recipes import grpo
from corag.recipes import sft as recipe
from corag.resources import CONFIGS
from corag.training import recipes as training_recipes

REPO = Path(__file__).resolve().parents[2]


def test_accumulation_keeps_the_effective_batch():
    steps = recipe.accumulation_steps
    assert [steps(256, 4, n) for n in (1, 8, 16, 64)] == [64, 8, 4, 1]
    assert steps(1024, 4, 8) == 32 and steps(1024, 4, 16) == 16
    with pytest.raises(
        InputError, match=r"effective_batch_size.*not a multiple of .* 4 x 12 process\(es\) = 48"
    ):
        steps(256, 4, 12)
    with pytest.raises(InputError):
        steps(256, 4, 128)  # fewer than one example per step


def test_the_recipe_derives_accumulation_from_the_world_size(monkeypatch, capsys):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    _, args, sft, _ = recipe.parse_args(["--config", str(REPO / "configs/sft/llama3.1-8b-full.yaml")])
    assert args.effective_batch_size == 256 and sft.gradient_accumulation_steps == 64  # 1 process
    recipe.apply_effective_batch(args, sft, 16)  # WORLD_SIZE on 2 nodes x 8 GPUs
    assert sft.gradient_accumulation_steps == 4
    args.effective_batch_size = 200
    with pytest.raises(SystemExit):
        recipe.apply_effective_batch(args, sft, 16)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "effective_batch_size" in err[-1] and "not a multiple" in err[-1]


def test_grpo_micro_steps_keep_the_questions_a_step():
    # 16 questions x 8 chains, one chain a micro-step: 1 process samples all 16, 2 processes 8 each, 8 two
    assert [grpo.micro_steps(16, 8, 1, n) for n in (1, 2, 8)] == [128, 64, 16]
    assert [grpo.micro_steps(2, 4, 8, 1), grpo.micro_steps(2, 4, 4, 2)] == [1, 1]  # the toy: 8 chains a step
    for n in (1, 2, 8):  # questions a step = processes x per-device batch x micro-steps / chains a question
        assert n * 1 * grpo.micro_steps(16, 8, 1, n) // 8 == 16
    with pytest.raises(
        InputError, match=r"questions_per_step.*16 questions a step do not split evenly over 3"
    ):
        grpo.micro_steps(16, 8, 1, 3)
    with pytest.raises(
        InputError, match=r"give each 4 chains .* not a multiple of per_device_train_batch_size 8"
    ):
        grpo.micro_steps(2, 4, 8, 2)


def test_the_grpo_recipe_derives_micro_steps_from_the_world_size(monkeypatch, capsys):
    config = ["--config", str(REPO / "configs/grpo/llama3.1-8b.yaml")]
    for world, steps in ((1, "128"), (2, "64"), (8, "16"), (16, "8")):
        argv = grpo.with_questions_per_step(config, world)
        assert argv[2:] == ["--steps_per_generation", steps, "--gradient_accumulation_steps", steps]
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    data, _, _, args, _ = grpo.parse_args(config)
    assert (
        data.questions_per_step == 16 and args.steps_per_generation == args.gradient_accumulation_steps == 128
    )
    assert args.generation_batch_size == 16 * args.num_generations  # trl's batch: 16 questions' chains
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SystemExit):
        grpo.parse_args(config)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("corag train grpo: error:") and "do not split evenly over 3" in err[-1]


def test_wandb_goes_offline_without_a_key_or_network(tmp_path):
    fallback = training_recipes.wandb_offline_if_unreachable
    never = lambda url: False  # noqa: E731
    always = lambda url: True  # noqa: E731
    env = {"NETRC": str(tmp_path / "none")}
    warning = fallback(["wandb"], env, always)
    assert env["WANDB_MODE"] == "offline" and "no W&B API key" in warning and "wandb sync" in warning
    env = {"NETRC": str(tmp_path / "none"), "WANDB_API_KEY": "k"}
    assert "cannot be reached" in fallback(["wandb"], env, never) and env["WANDB_MODE"] == "offline"
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    netrc.chmod(0o600)
    env = {"NETRC": str(netrc)}
    assert fallback(["wandb"], env, always) is None and "WANDB_MODE" not in env  # key from `wandb login`
    env = {"WANDB_MODE": "disabled"}
    assert fallback(["wandb"], env, never) is None and env == {"WANDB_MODE": "disabled"}
    assert fallback(["none"], {}, never) is None and fallback([], {}, never) is None


STUB_SRUN = """#!{python}
# Slurm's srun as far as the script uses it: records its options, runs the command once per node with
# SLURM_PROCID set (one task per node).
import json, os, subprocess, sys
args = sys.argv[1:]
options = []
while args and args[0].startswith("--"):
    options.append(args.pop(0))
with open(os.environ["STUB_RECORD"], "a") as f:
    f.write(json.dumps({{"srun": options}}) + "\\n")
for rank in range(int(os.environ["SLURM_NNODES"])):
    code = subprocess.run(args, env={{**os.environ, "SLURM_PROCID": str(rank)}}).returncode
    if code:
        sys.exit(code)
"""

STUB_ACCELERATE = """#!{python}
import json, os, sys
with open(os.environ["STUB_RECORD"], "a") as f:
    f.write(json.dumps({{"accelerate": sys.argv[1:], "procid": os.environ["SLURM_PROCID"]}}) + "\\n")
"""

STUB_SCONTROL = """#!/bin/sh
# scontrol: the job's host names, and the first node's address (STUB_NODEADDR; unknown node otherwise)
case "$1 $2 $3" in
  "show hostnames gpu-[017-018]") printf 'gpu-017\\ngpu-018\\n' ;;
  "show node gpu-017") [ -n "$STUB_NODEADDR" ] || exit 1
    echo "NodeName=gpu-017 Arch=x86_64 CoresPerSocket=32"
    echo "   NodeAddr=$STUB_NODEADDR NodeHostName=gpu-017 Version=23.11.4" ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
"""


@pytest.fixture
def slurm(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", STUB_SRUN), ("accelerate", STUB_ACCELERATE), ("scontrol", STUB_SCONTROL)):
        (bin_dir / name).write_text(text.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_VISIBLE_DEVICES"))}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        STUB_RECORD=str(tmp_path / "record.jsonl"),
        SLURM_JOB_ID="4242",
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="gpu-[017-018]",
        SLURM_GPUS_ON_NODE="8",
        SLURM_JOB_GPUS="4,5,6,7,8,9,10,11",  # physical ids: never used
        CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7",
        SLURM_SUBMIT_DIR=str(REPO),
        CORAG_LOG_DIR=str(tmp_path / "logs"),
        PYTHON=sys.executable,
    )
    return tmp_path, env


def submit(slurm, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    tmp, env = slurm
    done = subprocess.run(
        ["bash", str(REPO / "recipes/slurm_train.sh"), *args],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
    )
    path = tmp / "record.jsonl"
    return done, [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_two_nodes_one_accelerate_launch_each(slurm):
    config = "configs/sft/llama3.1-8b-full.yaml"
    slurm[1]["STUB_NODEADDR"] = "10.1.0.17"  # the address the other node reaches it at
    done, rows = submit(slurm, "sft", "fsdp", config, "--output_dir", "runs/sft/x")
    assert done.returncode == 0, done.stderr
    srun, *launches = rows
    assert "--kill-on-bad-exit=1" in srun["srun"] and "--ntasks-per-node=1" in srun["srun"]
    assert (
        "--nodes=2" in srun["srun"]
        and f"--output={slurm[0] / 'logs'}/corag-sft-%j-node%t.log" in srun["srun"]
    )
    assert [r["procid"] for r in launches] == ["0", "1"]
    for rank, row in enumerate(launches):
        assert row["accelerate"] == [
            "launch", "--config_file", str(CONFIGS / "accelerate" / "fsdp.yaml"), "--num_machines", "2",
            "--num_processes", "16", "--machine_rank", str(rank), "--main_process_ip", "10.1.0.17",
            "--main_process_port", str(29500 + 4242 % 1000), "--rdzv_backend", "c10d",
            "--rdzv_conf", "is_host=0", "-m", "corag.recipes.sft", "--config", config, "--output_dir", "runs/sft/x",
        ]  # fmt: skip
    assert (slurm[0] / "logs").is_dir()


def test_the_sbatch_header_sets_what_a_cluster_needs_and_no_size_a_smaller_node_refuses():
    header = [
        line
        for line in (REPO / "recipes/slurm_train.sh").read_text().splitlines()
        if line.startswith("#SBATCH")
    ]
    for option in (
        "--time=",
        "--signal=B:USR1@",
        "--requeue",
        "--nodes=",
        "--ntasks-per-node=1",
        "--output=",
    ):
        assert any(option in line for line in header), option
    for script in ("recipes/slurm_train.sh", "sampling/slurm_array.sh", "sampling/serve_retriever.sh",
                   "evaluation/slurm_eval.sh"):  # fmt: skip
        text = (REPO / script).read_text()
        assert "#SBATCH --mem" not in text and "#SBATCH --cpus-per-task" not in text, script
        assert "--mem=" in text and f"corag submit {script}" in text.replace("\n# ", " "), script  # said how


def test_bad_submissions_say_what_is_wrong(slurm):
    done, rows = submit(slurm, "sft", "nosuch", "configs/sft/llama3.1-8b-full.yaml")
    assert done.returncode == 2 and "configs/accelerate/nosuch.yaml" in done.stderr and rows == []
    done, rows = submit(slurm, "dpo", "ddp", "configs/sft/llama3.1-8b-full.yaml")
    assert done.returncode == 2 and "sft or grpo" in done.stderr and rows == []
    done, rows = submit(slurm, "sft", "ddp", "configs/sft/toy.yaml", "--serve-index", "data/index")
    assert done.returncode == 2 and "--serve-index is for grpo" in done.stderr and rows == []
    tmp, env = slurm
    gpu_vars = ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")
    env = {k: v for k, v in env.items() if k not in gpu_vars}
    done = subprocess.run(
        ["bash", str(REPO / "recipes/slurm_train.sh"), "sft", "ddp", "configs/sft/toy.yaml"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "no GPUs" in done.stderr
    env["CORAG_PROCS_PER_NODE"] = "1"  # 2 nodes x 1 process, as on CPUs
    done = subprocess.run(
        ["bash", str(REPO / "recipes/slurm_train.sh"), "sft", "ddp", "configs/sft/toy.yaml"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    launches = [json.loads(x) for x in (tmp / "record.jsonl").read_text().splitlines() if "accelerate" in x]
    launch = launches[-1]["accelerate"]
    assert launch[launch.index("--num_processes") + 1] == "2"
    assert launch[launch.index("--main_process_ip") + 1] == "gpu-017"  # no NodeAddr known: the node name


def test_grpo_nodes_each_search_their_own_service(slurm, toy_world):
    import httpx

    from corag.retrieval.bm25 import build_bm25_folder

    tmp, env = slurm
    build_bm25_folder([toy_world.passages], tmp / "bm25")
    env["PYTHON"] = sys.executable
    config = "configs/grpo/llama3.1-8b.yaml"
    done, rows = submit(
        slurm, "grpo", "zero3", config, "--serve-index", str(tmp / "bm25"), "--max_steps", "3"
    )
    assert done.returncode == 0, done.stderr
    srun, *launches = rows
    assert f"--output={tmp / 'logs'}/corag-grpo-%j-node%t.log" in srun["srun"]
    urls = []
    for rank, row in enumerate(launches):
        argv = row["accelerate"]
        recipe = argv[argv.index("corag.recipes.grpo") :]
        assert recipe[:5] == ["corag.recipes.grpo", "--config", config, "--max_steps", "3"]
        assert argv[-2] == "--retriever" and argv[-1].startswith("http://127.0.0.1:")
        urls.append(argv[-1])
        assert "serving" in (tmp / "logs" / f"retriever-4242-node{rank}.log").read_text()  # each node its own
    for url in urls:
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=5)  # stopped with its task
