"""The memory plan (corag.plan, `corag plan`): shipped configs fit their declared hardware, the layout
they replaced does not, and the arithmetic behind both."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from pathlib import Path

import pytest

from corag.commands.plan import main as plan_main
from corag.config import load_yaml
from corag.errors import InputError
from corag.plan import (
    GB,
    KNOWN_MODELS,
    Hardware,
    check_visible,
    estimate_wall_time,
    index_bytes,
    parse_hardware,
    parse_memory,
    parse_time,
    plan_stage,
    visible_gpu_memory,
)
from corag.retrieval.base import parse_devices

REPO = Path(__file__).resolve().parents[1]

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHIPPED = sorted(p for d in ("sampling", "eval", "sft", "grpo") for p in (CONFIGS / d).glob("*.yaml"))
MODELS = {
    "_8b-full.yaml": "meta-llama/Llama-3.1-8B-Instruct",
    "_8b.yaml": "runs/sft/llama3.1-8b-full",
    "toy.yaml": "runs/quickstart/models/warm",
}

# The sampling and evaluation layout shipped before the plan: vLLM at 0.85 and a local index folder
# loaded onto every GPU the process sees.
OLD_SAMPLING = """model: meta-llama/Llama-3.1-8B-Instruct
questions: data/multihopqa/train.jsonl
corpus: data/kilt-corpus
retriever: data/index/e5-large-v2
num_chains: 16
backend: vllm-async
tensor_parallel_size: 1
gpu_memory_utilization: 0.85
max_model_len: 8192
"""
OLD_EVAL = """model: corag/CoRAG-Llama3.1-8B-MultihopQA
data: data/multihopqa/musique_validation.jsonl
corpus: data/kilt-corpus
retriever: data/index/e5-large-v2
methods: ["greedy:L=6"]
backend: vllm-async
tensor_parallel_size: 1
gpu_memory_utilization: 0.85
max_model_len: 8192
"""


@pytest.mark.parametrize("config", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_config_fits_its_declared_hardware(config: Path, capsys) -> None:
    assert config.read_text().startswith("# hardware: ")
    trained = config.parent.name in ("sft", "grpo")
    extra = ["--model", MODELS[config.name]] if config.name in MODELS and trained else []
    assert plan_main(["--config", str(config), *extra]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("plan fits: ")


@pytest.mark.parametrize("old", [OLD_SAMPLING, OLD_EVAL], ids=["sampling", "eval"])
def test_the_old_layout_is_refused_on_8_x_80gb_naming_the_index(old: str, tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(old)
    with pytest.raises(InputError) as error:
        plan_main(["--config", str(path), "--gpus", "8", "--gpu-memory", "80GB"])
    message = str(error.value)
    assert "\n" not in message and "does not fit: index: " in message and "GPU 0" in message
    assert error.value.field == "index_devices"


def test_the_new_sampling_layout_needs_the_smaller_fraction(tmp_path: Path) -> None:
    text = (
        (CONFIGS / "sampling/llama3.1-8b.yaml")
        .read_text()
        .replace("gpu_memory_utilization: 0.5", "gpu_memory_utilization: 0.85")
    )
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match="field 'index_devices': does not fit: service: "):
        plan_main(["--config", str(path)])


def test_grpo_places_the_trainer_its_colocated_engine_and_the_service_on_every_gpu() -> None:
    config = CONFIGS / "grpo/llama3.1-8b.yaml"
    values = load_yaml(str(config))
    shape = KNOWN_MODELS["llama318b"]
    hw = Hardware(1, 8, 80 * GB, sharding="zero3")
    service = "data/index/e5-large-v2 --index-devices cuda:0-7 --device cuda:0"
    plan = plan_stage("grpo", values, hw, service=service)
    sizes = {item.name: item.size for item in plan.gpus[3]}
    assert sizes["vLLM engine (vllm_gpu_memory_utilization 0.25: weights + KV cache)"] == 0.25 * 80 * GB
    assert sizes["weights, gradients, Adam states (16 B/parameter, / 8)"] == shape.params * 16 / 8
    # each step's sub-query, sub-answer and stop decision (none after the last step), then the final answer
    rows = values["per_device_train_batch_size"] * (3 * values["max_chain_length"] - 1 + 1)
    (activations,) = [size for name, size in sizes.items() if name.startswith("checkpointed activations")]
    assert activations == rows * (4096 + 64 + 128) * shape.hidden * (shape.layers * 2 + 17 * 2)
    assert sizes["service: dense index shard (fp16)"] == index_bytes(35_700_000, 1024) / 8
    assert sizes["fp32 gradient partition at the optimizer step (DeepSpeed, / 8)"] == shape.params * 4 / 8
    # No colocated engine without use_vllm; a KL term to the reference adds its sharded bf16 weights.
    plan = plan_stage("grpo", {**values, "use_vllm": False, "beta": 0.04}, hw, service=service)
    names = [item.name for item in plan.gpus[3]]
    assert not any(name.startswith("vLLM engine") for name in names)
    assert [i.size for i in plan.gpus[3] if i.name.startswith("reference")] == [shape.params * 2 / 8]
    # Four chains' generations in one micro-step do not fit beside the engine and the index shard.
    with pytest.raises(InputError) as error:
        plan_stage("grpo", {**values, "per_device_train_batch_size": 4}, hw, service=service).check()
    assert error.value.field == "per_device_train_batch_size"


def test_arithmetic_on_hand_computed_cases() -> None:
    llama = KNOWN_MODELS["llama318b"]
    assert llama.kv_bytes_per_token() == 131072  # 32 layers x 8 kv heads x 128 x 2 (K, V) x 2 bytes
    assert abs(llama.params - 8_030_261_248) < 1e6
    assert abs(KNOWN_MODELS["qwen38b"].params / 1e9 - 8.19) < 0.01
    assert abs(KNOWN_MODELS["qwen34b"].params / 1e9 - 4.02) < 0.01
    assert abs(KNOWN_MODELS["smollm2"].params / 1e6 - 134.5) < 0.5
    assert round(index_bytes(35_700_000, 1024) / GB, 1) == 73.1
    values = {"model_name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "per_device_train_batch_size": 1,
              "max_length": 1}  # fmt: skip
    plan = plan_stage("sft", values, Hardware(1, 8, 80 * GB, sharding="zero3"))
    states = [i for i in plan.gpus[0] if i.name.startswith("weights, gradients")][0]
    assert states.size == llama.params * 16 / 8  # ZeRO-3: 16 B/param over 8 GPUs, ~16.1 GB each
    ddp = plan_stage("sft", values, Hardware(1, 8, 80 * GB, sharding="ddp"))
    assert [i for i in ddp.gpus[0] if i.name.startswith("weights, gradients")][0].size == llama.params * 16


def test_gpu_memory_and_hardware_parsing() -> None:
    assert parse_memory("80GB") == 80e9
    assert parse_memory("141GB") == 141e9
    assert parse_memory("80GiB") == 80 * 2**30
    with pytest.raises(InputError, match="80GB"):
        parse_memory("eighty")
    hw = parse_hardware("2 nodes x 8 GPUs x 141 GB, zero3")  # an H200 as nvidia-smi reports it
    assert (hw.nodes, hw.gpus, hw.gpu_memory, hw.sharding) == (2, 8, 143_771 * 2**20, "zero3")
    assert parse_hardware("1 node x 8 GPUs x 80 GB").gpu_memory == 81_559 * 2**20  # an H100's 85.5 GB
    assert parse_hardware("1 node x 8 GPUs x 80 GiB").gpu_memory == 80 * 2**30  # any other size: as written
    assert parse_hardware("1 node x 8 GPUs x 96 GB").gpu_memory == 96e9
    assert parse_hardware("CPU, 8 GB RAM").host_memory == 8e9


def test_device_lists_and_their_errors() -> None:
    assert parse_devices("cuda:0-3") == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert parse_devices("cuda:0,1") == ["cuda:0", "cuda:1"]
    assert parse_devices("cuda:0-1,6", 8) == ["cuda:0", "cuda:1", "cuda:6"]
    assert parse_devices("cpu", 0) == []
    assert parse_devices("cuda", 2) == ["cuda:0", "cuda:1"]
    with pytest.raises(InputError, match="cuda:4 does not exist"):
        parse_devices("cuda:0-7", 4)
    with pytest.raises(InputError, match="no CUDA device"):
        parse_devices("cuda", 0)
    for bad in ("gpu0", "cuda:3-1", "cuda:a", "cuda:0,0"):
        with pytest.raises(InputError):
            parse_devices(bad, 8)


def test_a_service_with_an_absent_device_is_refused(tmp_path: Path) -> None:
    text = (CONFIGS / "sampling/llama3.1-8b.yaml").read_text()
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match="cuda:4 does not exist"):
        plan_main(["--config", str(path), "--gpus", "4", "--gpu-memory", "80GB"])


FAKE_SMI = """#!/bin/sh
# nvidia-smi --query-gpu=index,uuid,memory.total: four 80 GB GPUs, the third a 24 GB one
printf '0, GPU-aaa0, 81559\\n1, GPU-aaa1, 81559\\n2, GPU-bbb2, 24564\\n3, GPU-aaa3, 81559\\n'
"""


def test_commands_check_the_gpus_they_see_without_starting_cuda(tmp_path, monkeypatch):
    (tmp_path / "nvidia-smi").write_text(FAKE_SMI)
    (tmp_path / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    gb = 2**20 * 81559, 2**20 * 24564
    assert visible_gpu_memory({}) == [gb[0], gb[0], gb[1], gb[0]]
    assert visible_gpu_memory({"CUDA_VISIBLE_DEVICES": "3,2"}) == [gb[0], gb[1]]
    assert visible_gpu_memory({"CUDA_VISIBLE_DEVICES": "GPU-aaa1,GPU-bbb"}) == [gb[0], gb[1]]  # UUID prefixes
    assert visible_gpu_memory({"CUDA_VISIBLE_DEVICES": "0,7,1"}) == [gb[0]]  # CUDA stops at a bad entry
    assert visible_gpu_memory({"CUDA_VISIBLE_DEVICES": "-1"}) == []
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-aaa0)'\n")
    assert visible_gpu_memory({}) == []  # output it cannot read: nothing known, nothing checked
    (tmp_path / "nvidia-smi").write_text(FAKE_SMI)
    values = load_yaml(REPO / "configs/eval/corag-llama3.1-8b.yaml")
    values["index_devices"] = "cuda:0-1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    check_visible("evaluate", values)  # two 80 GB GPUs hold the engine at 0.5 and half the index each
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")  # the 24 GB GPU cannot hold half the index
    with pytest.raises(InputError, match="does not fit"):
        check_visible("evaluate", values)
    assert "torch" not in sys.modules or not __import__("torch").cuda.is_initialized()


# Wall time -------------------------------------------------------------------------------------------

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def _jsonl(path: Path, rows: int) -> str:
    path.write_text("".join(f'{{"id": "{i}", "question": "q{i}", "answers": ["a"]}}\n' for i in range(rows)))
    return str(path)


def _rate(params: float) -> float:
    """The engine's tokens/s per GPU for a model of `params` on an H100: 5,000 x 8.03B / params."""
    return 5000 * 8.03e9 / params


def test_evaluation_time_is_questions_x_tokens_per_question_over_every_gpu(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "q.jsonl", 10)
    values = {"model": LLAMA, "data": data, "methods": ["greedy:L=2", "best_of_n:L=2:N=3"]}
    wall = estimate_wall_time("evaluate", values, Hardware(2, 4, 80 * GB))
    # a step is (9,855 - 3,000) / 6 = 1,142.5 tokens; greedy L=2: 3,000 + 2 steps; best-of-3 L=2: 3,000 + 6
    per_question = (3000 + 2 * 1142.5) + (3000 + 6 * 1142.5)
    assert per_question == 15140
    assert wall.seconds == pytest.approx(10 * 15140 / (8 * _rate(KNOWN_MODELS["llama318b"].params)))
    # the files given to the plan (as evaluation/slurm_eval.sh takes them) replace the config's
    other = _jsonl(tmp_path / "r.jsonl", 30)
    wall = estimate_wall_time("evaluate", values, Hardware(2, 4, 80 * GB), [data, other])
    assert wall.seconds == pytest.approx(40 * 15140 / (8 * _rate(KNOWN_MODELS["llama318b"].params)))
    tree = estimate_wall_time("evaluate", {**values, "methods": ["tree_search:L=2"]}, Hardware(1, 1, 80 * GB))
    assert tree.seconds == pytest.approx(
        10 * (3000 + 2 * 5.45 * 1142.5) / _rate(KNOWN_MODELS["llama318b"].params)
    )


def test_sampling_sft_and_grpo_times_follow_their_formulas(tmp_path: Path) -> None:
    params = KNOWN_MODELS["llama318b"].params
    hw = Hardware(1, 8, 80 * GB)
    questions = _jsonl(tmp_path / "train.jsonl", 100)
    # sampling: questions x chains x (mean length x (a step + a 300-token score))
    values = {"model": LLAMA, "questions": questions, "num_chains": 4, "min_length": 1, "max_length": 3}
    wall = estimate_wall_time("sample", values, hw)
    assert wall.seconds == pytest.approx(100 * 4 * 2 * (1142.5 + 300) / (8 * _rate(params)))
    # SFT: 100 chains x (1 + 2 x 0.2 x 3 steps) = 220 examples of (3,000 + 0.2 x 3 x 1,142.5) / 2.2 tokens,
    # 2 epochs; 8 FLOPs a parameter and token (activation checkpointing) at 30% of 989 TFLOPS
    values = {"model_name_or_path": LLAMA, "chains": questions, "ratio": 0.2, "num_train_epochs": 2,
              "activation_checkpointing": True}  # fmt: skip
    tokens = 220 * 2 * (3000 + 0.6 * 1142.5) / 2.2
    assert tokens == pytest.approx(737_100)
    wall = estimate_wall_time("sft", values, hw)
    assert wall.seconds == pytest.approx(tokens / (8 * 989e12 * 0.3 / (8 * params)))
    lora = estimate_wall_time("sft", {**values, "use_peft": True}, hw)  # no weight gradients: 4 + 2 FLOPs
    assert lora.seconds == pytest.approx(tokens / (8 * 989e12 * 0.3 / (6 * params)))
    # GRPO: steps x questions x chains x (3,000 + L steps + L - 1 stop decisions of two 300-token scores),
    # sampled then trained
    values = {"model_name_or_path": LLAMA, "max_steps": 10, "questions_per_step": 2, "num_generations": 4,
              "max_chain_length": 3, "activation_checkpointing": True}  # fmt: skip
    tokens = 10 * 2 * 4 * (3000 + 3 * 1142.5 + 2 * 2 * 300)
    wall = estimate_wall_time("grpo", values, hw)
    assert wall.seconds == pytest.approx(
        tokens / (8 * _rate(params)) + tokens / (8 * 989e12 * 0.3 / (8 * params))
    )


def test_a_plan_over_the_jobs_time_limit_says_so_in_one_line(tmp_path: Path, capsys) -> None:
    config = tmp_path / "eval.yaml"
    config.write_text(
        f"# hardware: 1 node x 8 GPUs x 80 GB\nmodel: {LLAMA}\ndata: {_jsonl(tmp_path / 'q.jsonl', 1000)}\n"
        'methods: ["best_of_n:L=6:N=4"]\nbackend: vllm\ngpu_memory_utilization: 0.5\nretriever: http://x\n'
    )
    # 1,000 x 30,420 tokens over 8 GPUs at ~5,000 tokens/s: 760 s, over a 5-minute limit by 2.5 times
    assert plan_main(["--config", str(config), "--time", "5:00"]) == 0
    lines = capsys.readouterr().out.splitlines()
    over = [line for line in lines if "over the job's limit" in line]
    assert over == [
        "wall time over the job's limit: 0.2 h on 1 node(s) against 0.1 h (--time 5:00); one submission "
        "needs 3 node(s), or 3 submissions of 1 (a rerun resumes)"
    ]
    assert lines[-1].startswith("plan fits: ")
    # without --time, the limit is the launch script's #SBATCH --time (24 h: well within)
    assert plan_main(["--config", str(config)]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("wall time")]
    assert line.endswith(
        "within the job's limit of 24.0 h (slurm_eval.sh #SBATCH --time=24:00:00)"
    )
    # the job's files as evaluation/slurm_eval.sh takes them: --data A --data B (or --data A B)
    other = _jsonl(tmp_path / "r.jsonl", 500)
    assert plan_main(["--config", str(config), "--data", str(tmp_path / "q.jsonl"), "--data", other]) == 0
    assert "- evaluation: 1,500 questions x 30,420 tokens" in capsys.readouterr().out


def test_slurm_times_and_what_is_not_estimated() -> None:
    assert parse_time("12:00:00") == 12 * 3600
    assert parse_time("1-00:00:00") == 86400
    assert parse_time("2-12") == 2 * 86400 + 12 * 3600
    assert parse_time("90") == 90 * 60
    assert parse_time("5:30") == 5 * 60 + 30
    with pytest.raises(InputError, match="12:00:00"):
        parse_time("twelve hours")
    cpu = estimate_wall_time("evaluate", {"model": LLAMA, "methods": ["greedy"]}, Hardware())
    assert cpu.seconds is None and cpu.verdict().startswith("wall time: not estimated (a CPU machine")
    absent = estimate_wall_time(
        "evaluate", {"model": LLAMA, "data": "nowhere/q.jsonl"}, Hardware(1, 8, 80 * GB)
    )
    assert absent.seconds is None and "nowhere/q.jsonl: not here" in absent.verdict()


# The wall-time table of docs/cluster.md: each GPU config as shipped (its header's hardware) and as the
# cluster path launches it. `python tests/test_plan.py` prints the table from `corag plan` itself.
MULTIHOP = [f"data/multihopqa/{n}.jsonl" for n in ("2wikimultihopqa_validation", "hotpotqa_validation",
            "bamboogle_test", "musique_validation")]  # fmt: skip
TABLE1 = ["--data", *MULTIHOP]
WALL_ROWS = [  # config, its flags as the table shows them, the flags
    ("sampling/llama3.1-8b.yaml", "", []),
    ("sampling/llama3.1-8b.yaml", "--nodes 2", ["--nodes", "2"]),
    ("sampling/qwen3-8b.yaml", "", []),
    ("sampling/llama3.1-8b-kilt.yaml", "--nodes 8", ["--nodes", "8"]),
    ("sft/llama3.1-8b-full.yaml", "", []),
    ("sft/llama3.1-8b-full.yaml", "--nodes 2", ["--nodes", "2"]),
    ("sft/llama3.1-8b-kilt-full.yaml", "", []),
    ("sft/qwen3-8b-full.yaml", "", []),
    ("sft/qwen3-4b-lora.yaml", "", []),
    ("grpo/llama3.1-8b.yaml", "", []),
    ("grpo/qwen3-8b.yaml", "", []),
    ("eval/corag-llama3.1-8b.yaml", "", []),
    ("eval/qwen3-8b.yaml", "", []),
    ("eval/corag-llama3.1-8b-kilt.yaml", "", []),
    ("eval/corag-llama3.1-8b-table1.yaml", "--data (the four sets)", TABLE1),
    ("eval/corag-llama3.1-8b-table1.yaml", "--nodes 2 --data (the four sets)", ["--nodes", "2", *TABLE1]),
]


def wall_row(config: str, label: str, extra: list[str]) -> str:
    """A table row from `corag plan`'s own output: the config and flags, tokens, estimate and verdict."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        plan_main(["--config", str(CONFIGS / config), *extra])
    lines = out.getvalue().splitlines()
    verdict = next(line for line in lines if line.startswith("wall time"))
    tokens = next(
        m for line in lines if (m := re.match(r"- (?:evaluation|sampling|SFT|GRPO): .* = ([0-9.]+B)", line))
    )
    hours = re.match(r"wall time[^:]*: ([0-9.]+ h) on (\d+) node\(s\)", verdict)
    assert hours, verdict
    if "over the job's limit" in verdict:
        against = "over: " + verdict.split("; ", 1)[1].replace(" (a rerun resumes)", "")
    else:
        against = "within " + re.search(r"limit of ([0-9.]+ h)", verdict).group(1)
    name = f"`{config}` {label}".strip()
    return f"| {name} | {hours.group(2)} | {tokens.group(1)} | {hours.group(1)} | {against} |"


def wall_table() -> str:
    """The docs' table: a row per WALL_ROWS entry."""
    head = (
        "| config (`configs/...`), `corag plan` flags | nodes | tokens | wall time | the job's time limit |"
    )
    return "\n".join([head, "|---|---|---|---|---|", *(wall_row(*row) for row in WALL_ROWS)])


def test_the_wall_time_table_in_the_docs_is_corag_plans() -> None:
    assert wall_table() in (REPO / "docs/cluster.md").read_text()


if __name__ == "__main__":
    print(wall_table())


def test_an_iterate_config_plans_each_stage_it_submits_on_its_nodes(monkeypatch, capsys) -> None:
    monkeypatch.chdir(REPO)  # its stage configs are named from the project folder
    assert plan_main(["--config", "configs/iterate/llama3.1-8b.yaml"]) == 0
    out = capsys.readouterr().out
    assert "== sample: configs/sampling/llama3.1-8b.yaml on 2 node(s)" in out  # the array's 2 tasks
    assert "== sft: configs/sft/llama3.1-8b-full.yaml on 2 node(s)" in out
    assert "== evaluate: configs/eval/corag-llama3.1-8b.yaml on 2 node(s)" in out
    assert "musique_validation.jsonl: 2,417 questions" in out  # the round's held-out questions
    assert out.count("plan fits: ") == 4 and out.strip().splitlines()[-1].startswith("plan fits: every stage")
    assert plan_main(["--config", "configs/iterate/toy.yaml"]) == 0
    assert "launcher local runs every stage on this machine; nothing to plan" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "nodes"), [("--array=0-1 --mem=8G", 2), ("-a 0-30:2", 16), ("--array=1,3,8-9%2", 4),
                         ("--nodes=3", 3), ("-N 2", 2), ("--mem=8G", 1)],
)  # fmt: skip
def test_the_nodes_of_a_stage_come_from_its_sbatch_flags(flags: str, nodes: int) -> None:
    from corag.commands.plan import sbatch_nodes

    assert sbatch_nodes(flags) == nodes
