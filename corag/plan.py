"""The memory plan of a stage: what each GPU and each process's host memory holds, refused before
anything starts when it cannot fit.

`plan_stage` lays out one stage (rejection sampling, evaluation, SFT, the retrieval service) on some
hardware from the stage's config values: vLLM engines at their `gpu_memory_utilization` (weights and KV
cache inside that share), dense index shards on the devices that hold them, the SFT recipe's weights,
gradients, Adam states and checkpointed activations, and host memory per process. `Plan.check` raises an
InputError naming the first item that does not fit. `corag plan` prints it; the commands that start
engines or load an index run the same check against the devices they see.

Figures are bytes, shown in GB (10^9 bytes) as GPU memory is sold. Weights, KV cache, index shards and
optimizer states are exact arithmetic; activations, CUDA contexts and the reserve are estimates, and
the table says so.

`estimate_wall_time` gives a stage's wall time on the same hardware: questions (or examples, or steps)
x tokens each over the GPUs' throughput, each figure an estimate with its source beside it; `WallTime`
says in one line whether it fits the job's time limit and, if not, how many nodes or submissions it needs.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corag.cluster.submit import parse_time
from corag.errors import InputError
from corag.resources import stage_script
from corag.retrieval.base import parse_devices

GB = 1e9
STAGES = ("sample", "evaluate", "sft", "grpo", "serve")
# Per GPU, before anything else: the caching allocator's fragmentation, NCCL and cuBLAS workspaces.
RESERVE = 2 * GB
# A process's CUDA context on each device it touches (H100, CUDA 12: 0.4-0.6 GB); an estimate.
CUDA_CONTEXT = 0.5 * GB
# A Python process with torch, transformers and the corpus store's lookups (an estimate).
RUNTIME_HOST = 2 * GB
# The released E5-large-v2 (335M parameters) in fp16, the query encoder of every dense index here.
ENCODER_PARAMS = 335_141_888
# The KILT corpus of the CoRAG release (corag/kilt-corpus) and its E5-large-v2 vectors.
KILT_ROWS, KILT_DIM = 35_700_000, 1024
# corag.retrieval.dense: queries scored at once and rows per block on a GPU shard (scores in fp16, then
# fp32 for top-k: 6 bytes per score).
QUERY_ROWS, BLOCK_ROWS = 256, 1 << 20
SHARDINGS = ("zero3", "fsdp", "ddp")
# The widest GRPO row: a 4096-token message (corag.prompts caps calls A and B there), the chat template
# around it and a 128-token answer.
GRPO_ROW_TOKENS = 4096 + 64 + 128


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on in a decoder's config.json."""

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    context: int = 131072  # max_position_embeddings

    @property
    def params(self) -> int:
        """Parameters of a Llama/Qwen-style decoder (attention, gated MLP, norms, embeddings)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * q + 2 * self.hidden * kv + q * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        layer = (
            attention + mlp + 2 * self.hidden + (2 * self.head_dim if self.name.startswith("Qwen3") else 0)
        )
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * layer + embeddings + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV cache per token: layers x kv_heads x head_dim x (K and V) x bytes."""
        return self.layers * self.kv_heads * self.head_dim * 2 * dtype_bytes

    def lora_params(self, rank: int, targets: list[str] | str) -> int:
        """Adapter parameters: rank x (in + out) for each targeted linear layer of every decoder layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes = {
            "q_proj": (self.hidden, q),
            "k_proj": (self.hidden, kv),
            "v_proj": (self.hidden, kv),
            "o_proj": (q, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }
        names = list(shapes) if targets == "all-linear" else [t for t in targets if t in shapes]
        return self.layers * sum(rank * sum(shapes[n]) for n in names)


# From each model's config.json on the Hugging Face Hub (meta-llama/Llama-3.1-8B-Instruct, Qwen/Qwen3-8B,
# Qwen/Qwen3-4B, HuggingFaceTB/SmolLM2-135M-Instruct, Qwen/Qwen2.5-7B: the base of the released Search-R1
# checkpoints) and corag.toy.tinymodel's defaults; parameter counts follow (8.03B, 8.19B, 4.02B, 134.5M
# as published).
KNOWN_MODELS = {
    "llama318b": ModelShape("Llama-3.1-8B", 128256, 4096, 32, 32, 8, 128, 14336, False),
    "qwen257b": ModelShape("Qwen2.5-7B", 152064, 3584, 28, 28, 4, 128, 18944, False),
    "qwen38b": ModelShape("Qwen3-8B", 151936, 4096, 36, 32, 8, 128, 12288, False),
    "qwen34b": ModelShape("Qwen3-4B", 151936, 2560, 36, 32, 8, 128, 9728, True),
    "smollm2": ModelShape("SmolLM2-135M", 49152, 576, 30, 9, 3, 64, 1536, True),
    "quickstart": ModelShape("toy tiny model", 4096, 128, 2, 2, 2, 64, 512, False, 2048),
}


def model_shape(model: str) -> ModelShape:
    """The shape of `model`: its config.json when the folder is here, else the known model its name
    names (Llama-3.1-8B, Qwen2.5-7B, Qwen3-8B, Qwen3-4B, SmolLM2-135M, the toy model)."""
    config = Path(model) / "config.json"
    if config.is_file():
        c = json.loads(config.read_text())
        c = c.get("text_config", c)
        heads = int(c["num_attention_heads"])
        return ModelShape(
            str(c.get("_name_or_path") or Path(model).name),
            int(c["vocab_size"]),
            int(c["hidden_size"]),
            int(c["num_hidden_layers"]),
            heads,
            int(c.get("num_key_value_heads") or heads),
            int(c.get("head_dim") or c["hidden_size"] // heads),
            int(c["intermediate_size"]),
            bool(c.get("tie_word_embeddings", False)),
            int(c.get("max_position_embeddings") or 131072),
        )
    key = re.sub(r"[^a-z0-9]", "", model.lower())
    for name, shape in KNOWN_MODELS.items():
        if name in key or (name == "quickstart" and "toy" in key):
            return shape
    known = ", ".join(s.name for s in KNOWN_MODELS.values())
    raise InputError(f"unknown model size: no config.json at {model!r} and not one of {known}", field="model")


def parse_memory(text: str) -> float:
    """Bytes in "80GB", "141GB", "80GiB", "512MB", "1.5TB" (GB = 10^9 bytes, GiB = 2^30)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B)\s*", text, re.IGNORECASE)
    if not m:
        raise InputError(f"expected a size such as 80GB or 80GiB, got {text!r}", field="--gpu-memory")
    unit = m.group(2).upper()
    power = "KMGT".index(unit[0]) + 1
    return float(m.group(1)) * ((1024**power) if unit[1] == "I" else (1000**power))


@dataclass
class Hardware:
    """Nodes x GPUs of a given memory (0 GPUs: a CPU machine), host memory when known, SFT sharding."""

    nodes: int = 1
    gpus: int = 0
    gpu_memory: float = 0.0
    host_memory: float | None = None
    sharding: str | None = None

    def describe(self) -> str:
        parts = [f"{self.nodes} node(s) x {self.gpus} GPU(s) x {self.gpu_memory / GB:.1f} GB" if self.gpus else
                 "a CPU machine"]  # fmt: skip
        if self.host_memory:
            parts.append(f"{self.host_memory / GB:g} GB RAM")
        if self.sharding:
            parts.append(self.sharding)
        return ", ".join(parts)


# What nvidia-smi reports as memory.total for the smallest card sold under a nominal size, in MiB: H100
# 80GB 81,559 (an A100 80GB has 81,920), A100 40GB 40,960, L40S 46,068, A10 23,028 (modal-labs/modal-client
# PR #2797); H200 143,771 (published nvidia-smi tables). A hardware line's "80 GB" plans on 81,559 MiB,
# as vLLM's gpu_memory_utilization takes its share of that total.
CARD_MIB = {80: 81_559, 141: 143_771, 40: 40_960, 48: 46_068, 24: 23_028}


def card_memory(text: str) -> float:
    """Bytes of a GPU named by its size: a nominal "80 GB" as the card reports it, any other size as written."""
    size = parse_memory(text)
    nominal = re.fullmatch(r"\s*([0-9]+)\s*GB\s*", text, re.IGNORECASE)
    return CARD_MIB[int(nominal.group(1))] * 2**20 if nominal and int(nominal.group(1)) in CARD_MIB else size


HARDWARE_LINE = re.compile(r"#\s*hardware:\s*(.*)", re.IGNORECASE)
SERVICE_LINE = re.compile(r"#\s*beside:\s*corag\s+serve-retriever\s+(.*)", re.IGNORECASE)


def parse_hardware(text: str, file: str | None = None) -> Hardware:
    """A config's hardware line: `1 node x 8 GPUs x 80 GB`, `... x 80 GB, zero3`, `CPU, 8 GB RAM`."""
    hw = Hardware()
    gpus = re.search(r"(\d+)\s*nodes?\s*x\s*(\d+)\s*GPUs?\s*x\s*([0-9.]+\s*[KMGT]i?B)", text, re.IGNORECASE)
    if gpus:
        hw.nodes, hw.gpus, hw.gpu_memory = int(gpus.group(1)), int(gpus.group(2)), card_memory(gpus.group(3))
    elif not re.search(r"\bCPU\b", text):
        raise InputError(
            f"expected `N node(s) x G GPUs x 80 GB` or `CPU, 8 GB RAM`, got {text!r}",
            file=file,
            field="hardware",
        )
    if ram := re.search(r"([0-9.]+\s*[KMGT]i?B)\s*(?:of\s*)?RAM", text, re.IGNORECASE):
        hw.host_memory = parse_memory(ram.group(1))
    if sharding := re.search(r"\b(zero3|fsdp|ddp)\b", text, re.IGNORECASE):
        hw.sharding = sharding.group(1).lower()
    return hw


def read_header(path: str | Path) -> tuple[Hardware | None, str | None]:
    """A config's `# hardware:` line (parsed) and its `# beside: corag serve-retriever ...` line (the
    service sharing the node's GPUs, as arguments), each None when absent."""
    hardware, service = None, None
    for line in Path(path).read_text().splitlines():
        if m := HARDWARE_LINE.match(line.strip()):
            hardware = parse_hardware(m.group(1), str(path))
        elif m := SERVICE_LINE.match(line.strip()):
            service = m.group(1).strip()
    return hardware, service


def detect_stage(values: dict[str, Any], file: str | None = None) -> str:
    """The stage a config is for, from its keys."""
    if "num_generations" in values:
        return "grpo"
    if "num_chains" in values or "questions" in values:
        return "sample"
    if "methods" in values or "data" in values or "strategy" in values:
        return "evaluate"
    if "model_name_or_path" in values or "learning_rate" in values or "per_device_train_batch_size" in values:
        return "sft"
    if "index" in values:
        return "serve"
    raise InputError("cannot tell the stage from the keys; give --stage", file=file)


@dataclass
class Item:
    """One thing in memory: what, how many bytes, which config key decides it, and a note."""

    name: str
    size: float
    key: str = ""
    note: str = ""


@dataclass
class Plan:
    """Per GPU (of one node; every node alike) and per process on the host, the items in load order."""

    stage: str
    hardware: Hardware
    gpus: list[list[Item]] = field(default_factory=list)
    host: dict[str, list[Item]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    file: str | None = None

    def check(self) -> None:
        """Refuse the plan at its first item that passes a GPU's (or the host's) capacity."""
        for g, items in enumerate(self.gpus):
            self._check(items, self.hardware.gpu_memory, f"GPU {g}")
        if self.hardware.host_memory:
            total = [i for items in self.host.values() for i in items]
            self._check(total, self.hardware.host_memory, "host memory")

    def _check(self, items: list[Item], capacity: float, where: str) -> None:
        used = 0.0
        for item in items:
            if used + item.size > capacity:
                raise InputError(
                    f"does not fit: {item.name} ({item.size / GB:.1f} GB) on {where} beside {used / GB:.1f} GB "
                    f"already planned, capacity {capacity / GB:.1f} GB ({self.hardware.describe()})",
                    file=self.file,
                    field=item.key or None,
                )
            used += item.size

    def table(self) -> str:
        """One table: per GPU (identical GPUs in one column) each item in GB, total, capacity, headroom;
        then host memory per process."""
        groups: list[tuple[list[int], list[Item]]] = []
        for g, items in enumerate(self.gpus):
            if groups and _same(groups[-1][1], items):
                groups[-1][0].append(g)
            else:
                groups.append(([g], items))
        names: list[str] = []
        for _, items in groups:
            names += [i.name for i in items if i.name not in names]
        heads = [f"GPU {g[0]}" if len(g) == 1 else f"GPUs {g[0]}-{g[-1]}" for g, _ in groups]
        rows = [["per GPU, GB", *heads]]
        for name in names:
            cells = []
            for _, items in groups:
                size = sum(i.size for i in items if i.name == name)
                cells.append(f"{size / GB:.1f}" if any(i.name == name for i in items) else "-")
            rows.append([name, *cells])
        totals = [sum(i.size for i in items) for _, items in groups]
        cap = self.hardware.gpu_memory
        rows.append(["total", *(f"{t / GB:.1f}" for t in totals)])
        rows.append(["capacity", *(f"{cap / GB:.1f}" for _ in groups)])
        rows.append(["headroom", *(f"{(cap - t) / GB:.1f}" for t in totals)])
        lines = _render(rows) if groups else []
        host = [["host memory per process, GB", "GB"]]
        for process, items in self.host.items():
            for item in items:
                host.append([f"{process}: {item.name}", f"{item.size / GB:.1f}"])
        host_total = sum(i.size for items in self.host.values() for i in items)
        host.append(["total", f"{host_total / GB:.1f}"])
        if self.hardware.host_memory:
            host.append(["capacity", f"{self.hardware.host_memory / GB:.1f}"])
            host.append(["headroom", f"{(self.hardware.host_memory - host_total) / GB:.1f}"])
        lines += ([""] if lines else []) + _render(host)
        return "\n".join([*lines, *(f"- {n}" for n in dict.fromkeys(self.notes))])

    def summary(self) -> str:
        """The last line: the stage, the hardware and the tightest headroom."""
        if self.gpus:
            cap = self.hardware.gpu_memory
            worst = max(sum(i.size for i in items) for items in self.gpus)
            return (
                f"plan fits: {self.stage} on {self.hardware.describe()}; fullest GPU {worst / GB:.1f} of "
                f"{cap / GB:.1f} GB ({(cap - worst) / GB:.1f} GB headroom)"
            )
        total = sum(i.size for items in self.host.values() for i in items)
        return f"plan fits: {self.stage} on {self.hardware.describe()}; host memory {total / GB:.1f} GB"


def _same(a: list[Item], b: list[Item]) -> bool:
    return [(i.name, round(i.size)) for i in a] == [(i.name, round(i.size)) for i in b]


def _render(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    out = []
    for n, row in enumerate(rows):
        out.append("| " + " | ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in
                                     enumerate(zip(row, widths, strict=True))) + " |")  # fmt: skip
        if n == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return out


# Index ---------------------------------------------------------------------------------------------


def index_size(folder: str | None) -> tuple[int, int, str]:
    """(rows, dim, where the figures come from) of a dense index folder; the KILT size when the folder
    is not here (the shipped configs' index)."""
    if folder and (Path(folder) / "manifest.json").is_file():
        manifest = json.loads((Path(folder) / "manifest.json").read_text())
        if manifest.get("kind") != "dense":
            return 0, 0, f"{folder}: a {manifest.get('kind')} index (CPU)"
        rows = int(
            manifest.get("corpus_size") or sum(int(c.get("rows", 0)) for c in manifest.get("chunks", []))
        )
        return rows, int(manifest["dim"]), f"{folder}/manifest.json"
    return KILT_ROWS, KILT_DIM, f"{folder} is not here: KILT's {KILT_ROWS / 1e6:.1f}M x {KILT_DIM} assumed"


def index_bytes(rows: int, dim: int, dtype_bytes: int = 2) -> float:
    """An exact index's vectors: rows x dim x bytes (fp16 on GPUs)."""
    return float(rows) * dim * dtype_bytes


def add_index(
    gpus: list[list[Item]], devices: list[int], rows: int, dim: int, encoder_gpu: int | None, who: str
) -> None:
    """A dense index's fp16 shards split over `devices`, its query encoder and search workspace, and a
    CUDA context for the process that holds them, on each device."""
    for d in devices:
        gpus[d].append(Item(f"{who}: CUDA context (estimate)", CUDA_CONTEXT))
    if encoder_gpu is not None:
        gpus[encoder_gpu].append(
            Item(f"{who}: query encoder (E5-large-v2, fp16)", ENCODER_PARAMS * 2, "device")
        )
    shard = index_bytes(rows, dim) / max(1, len(devices))
    shard_rows = rows / max(1, len(devices))
    workspace = QUERY_ROWS * min(BLOCK_ROWS, shard_rows) * 6
    for d in devices:
        gpus[d].append(Item(f"{who}: dense index shard (fp16)", shard, "index_devices"))
        gpus[d].append(
            Item(f"{who}: search scores ({QUERY_ROWS} queries x block)", workspace, "index_devices")
        )


# Stages --------------------------------------------------------------------------------------------


def _engine_items(
    values: dict[str, Any],
    shape: ModelShape,
    capacity: float,
    notes: list[str],
    key: str = "gpu_memory_utilization",
) -> list[Item]:
    """One vLLM engine's share of each of its GPUs: weights / tensor_parallel_size + KV cache (`key`: the
    config key of its memory fraction)."""
    util = float(values.get("gpu_memory_utilization", 0.9))
    tp = int(values.get("tensor_parallel_size", 1))
    share = util * capacity
    weights = shape.params * 2 / tp
    kv = share - weights
    per_token = shape.kv_bytes_per_token() / tp
    max_len = int(values.get("max_model_len") or 8192)
    if kv < per_token * max_len:
        raise InputError(
            f"does not fit: the vLLM engine's share {share / GB:.1f} GB ({key} {util}) "
            f"holds {shape.name}'s weights ({weights / GB:.1f} GB per GPU) but not one sequence of "
            f"{max_len} tokens of KV cache",
            field=key,
        )
    notes.append(
        f"vLLM engine at {key} {util}: {shape.name} weights {weights / GB:.1f} GB per GPU "
        f"(bf16, {shape.params / 1e9:.2f}B parameters / tensor_parallel_size {tp}), KV cache up to "
        f"{kv / GB:.1f} GB = {kv / per_token / 1e3:.0f}k tokens at {shape.kv_bytes_per_token()} bytes/token "
        "(vLLM's own activation peak comes out of it)"
    )
    return [
        Item(
            f"vLLM engine ({key} {util}: weights + KV cache)",
            share,
            key,
        )
    ]


def _service(argv: str | None) -> dict[str, Any] | None:
    """The options of a `# beside: corag serve-retriever INDEX --index-devices ...` line."""
    if argv is None:
        return None
    words = argv.split()
    values: dict[str, Any] = {"index": words[0] if words else None, "workers": 1}
    for flag, value in zip(words[1::2], words[2::2], strict=False):
        values[flag.lstrip("-").replace("-", "_")] = value
    return values


def plan_stage(
    stage: str,
    values: dict[str, Any],
    hardware: Hardware,
    service: str | None = None,
    file: str | None = None,
    in_use: list[float] | None = None,
) -> Plan:
    """The plan of `stage` under config `values` on `hardware` (one node's GPUs; every node alike).

    `service` is a `serve-retriever` argument line sharing the node's GPUs (the config's `# beside:`
    line); `in_use` is memory already taken on each GPU by other processes (a command's own check)."""
    if stage not in STAGES:
        raise InputError(f"unknown stage {stage!r}; choose one of {STAGES}", field="--stage")
    plan = Plan(stage, hardware, file=file)
    gpus: list[list[Item]] = [[Item("reserve (fragmentation, NCCL, cuBLAS; estimate)", RESERVE)] for _ in
                              range(hardware.gpus)]  # fmt: skip
    for g, used in enumerate(in_use or []):
        if used > 0:
            gpus[g].append(Item("in use by other processes", used))
    plan.gpus = gpus
    try:
        if stage == "sft":
            _plan_sft(plan, values)
        elif stage == "grpo":
            _plan_grpo(plan, values, _service(service))
        elif stage == "serve":
            _plan_serve(plan, values)
        else:
            _plan_engines(plan, values, _service(service))
    except InputError as error:
        if error.file is None and file is not None:
            raise InputError(error.message, file=file, field=error.field) from None
        raise
    return plan


def _plan_engines(plan: Plan, values: dict[str, Any], service: dict[str, Any] | None) -> None:
    """Sampling or evaluation: engines (one per tensor_parallel_size GPUs for sampling, one for evaluation)
    and the index, in the process (an index folder) or in a service beside them (a URL)."""
    hw, gpus = plan.hardware, plan.gpus
    backend = values.get("backend", "hf")
    model = values.get("model")
    if not model:
        raise InputError("no model to plan for; give --model", field="model")
    shape = model_shape(str(model))
    tp = int(values.get("tensor_parallel_size", 1))
    retriever = str(values.get("retriever") or "")
    url = retriever.startswith(("http://", "https://"))
    host = plan.host.setdefault("each engine process" if plan.stage == "sample" else "the process", [])
    host.append(Item("Python, torch, corpus store lookups (estimate)", RUNTIME_HOST))
    if not hw.gpus:
        if backend.startswith("vllm"):
            plan.notes.append(
                "vLLM on a CPU machine: its KV cache is VLLM_CPU_KVCACHE_SPACE, not counted here"
            )
        host.append(Item(f"{shape.name} weights (fp32)", shape.params * 4.0, "model"))
        if retriever and not url:
            rows, dim, source = index_size(retriever)
            host.append(
                Item("dense index read buffer (chunks stream from the page cache)", 32768 * dim * 4.0)
            )
            plan.notes.append(f"index: {source}")
        return
    # Each sampling engine is its own process seeing its own GPUs; evaluation is one process on the node.
    groups = [list(range(e * tp, (e + 1) * tp)) for e in range(hw.gpus // tp)] if plan.stage == "sample" else [
        list(range(tp))]  # fmt: skip
    if tp > hw.gpus:
        raise InputError(f"an engine needs {tp} GPUs, the node has {hw.gpus}", field="tensor_parallel_size")
    if backend.startswith("vllm"):
        items = _engine_items(values, shape, hw.gpu_memory, plan.notes)
        for group in groups:
            for g in group:
                gpus[g].extend(items)
    elif backend == "hf":
        for group in groups:
            gpus[group[0]].append(
                Item(f"{shape.name} weights (bf16, transformers)", shape.params * 2.0, "model")
            )
    if service:
        _add_service(plan, service)
    if retriever and not url:
        rows, dim, source = index_size(retriever)
        plan.notes.append(f"index in the process: {source}")
        spec = values.get("index_devices")
        for group in groups:
            if rows == 0:
                continue
            seen = len(group) if plan.stage == "sample" else hw.gpus
            names = parse_devices(str(spec), seen) if spec else [f"cuda:{i}" for i in range(seen)]
            local = [int(d.split(":")[1]) for d in names]
            devices = [group[d] if plan.stage == "sample" else d for d in local]
            if not spec:
                plan.notes.append(
                    "no index_devices: the index goes onto every GPU the process sees"
                    + (" (its engine's own)" if plan.stage == "sample" else "")
                )
            if devices:
                add_index(gpus, devices, rows, dim, devices[0], "index")
            else:
                host.append(
                    Item("dense index read buffer (chunks stream from the page cache)", 32768 * dim * 4.0)
                )
            if plan.stage == "sample" and not devices:
                break
    elif not url and not service:
        plan.notes.append("no retriever given")


def _add_service(plan: Plan, service: dict[str, Any]) -> None:
    """A `corag serve-retriever` beside the stage's processes, its index shards on the node's GPUs."""
    rows, dim, source = index_size(service.get("index"))
    devices = [
        int(d.split(":")[1])
        for d in parse_devices(service.get("index_devices") or "cuda", plan.hardware.gpus)
    ]
    encoder = int(str(service.get("device") or "cuda:0").split(":")[-1]) if devices else None
    for _ in range(int(service.get("workers", 1))):
        add_index(plan.gpus, devices, rows, dim, encoder, "service")
    plan.host["the retrieval service"] = [
        Item("Python, torch, index loading buffers (estimate)", RUNTIME_HOST)
    ]
    plan.notes.append(f"retrieval service beside the {plan.stage} processes: {source}")


def _plan_serve(plan: Plan, values: dict[str, Any]) -> None:
    """`corag serve-retriever`: each worker holds the whole index on its devices."""
    hw = plan.hardware
    rows, dim, source = index_size(values.get("index"))
    plan.notes.append(f"index: {source}")
    workers = int(values.get("workers", 1))
    for w in range(workers):
        plan.host[f"worker {w}"] = [Item("Python, torch, index loading buffers (estimate)", RUNTIME_HOST)]
    if not hw.gpus or rows == 0:
        return
    spec = values.get("index_devices")
    devices = (
        [int(d.split(":")[1]) for d in parse_devices(str(spec), hw.gpus)] if spec else list(range(hw.gpus))
    )
    encoder = int(str(values.get("device") or "cuda:0").split(":")[-1]) if devices else None
    for _ in range(workers):
        add_index(plan.gpus, devices, rows, dim, encoder, "service")


def _plan_sft(plan: Plan, values: dict[str, Any]) -> None:
    """The SFT recipe: weights, gradients and Adam states (sharded under ZeRO-3/FSDP, whole under DDP)
    or LoRA's frozen weights and adapter states, plus checkpointed activations (an estimate)."""
    shape = _trained_model(values)
    tokens = int(values.get("per_device_train_batch_size", 8)) * int(values.get("max_length", 1024))
    _place_trainer(plan, _trainer_items(plan, values, shape, tokens), shape)


def _plan_grpo(plan: Plan, values: dict[str, Any], service: dict[str, Any] | None) -> None:
    """The GRPO recipe: the trainer's items as for SFT (activations for one micro-step's rows, each as
    wide as the widest), the reference model when `beta` > 0, each process's colocated vLLM engine
    (`use_vllm`) and a retrieval service beside them (the config's `# beside:` line)."""
    shape = _trained_model(values)
    lora = bool(values.get("use_peft"))
    chains = int(values.get("per_device_train_batch_size", 8))
    rows = chains * grpo_rows_per_chain(values)
    width = min(GRPO_ROW_TOKENS, shape.context)
    items = _trainer_items(plan, values, shape, rows * width)
    plan.notes.append(
        f"GRPO micro-step: {chains} chain(s) per process x up to {rows // chains} sampled generations each "
        f"(per step a sub-query, a sub-answer and a stop decision, then the final answer; greedy calls give no "
        f"row), every row padded to the widest ({width} tokens: a 4096-token message, template and answer, "
        "or the model's context)"
    )
    if _sharding(plan.hardware, lora) == "zero3" and not lora:
        shard = _shards(plan.hardware, lora)
        items.append(
            Item(
                f"fp32 gradient partition at the optimizer step (DeepSpeed, / {shard})",
                shape.params * 4.0 / shard,
            )
        )
    if float(values.get("beta", 0.0)) > 0 and not lora:
        shard = _shards(plan.hardware, lora)
        items.append(Item(f"reference model (bf16, / {shard})", shape.params * 2.0 / shard, "beta"))
    if values.get("use_vllm") and plan.hardware.gpus:
        engine = {
            "gpu_memory_utilization": values.get("vllm_gpu_memory_utilization", 0.3),
            "max_model_len": values.get("vllm_max_model_length"),
        }
        items += _engine_items(
            engine, shape, plan.hardware.gpu_memory, plan.notes, key="vllm_gpu_memory_utilization"
        )
    _place_trainer(plan, items, shape)
    if service and plan.hardware.gpus:
        _add_service(plan, service)


def grpo_rows_per_chain(values: dict[str, Any]) -> int:
    """The most rows one chain can give (corag.training.rollout): L sub-queries, L sub-answers, L - 1 stop
    decisions (with learned_stop) and the final answer, of the kinds in `sampled_calls`."""
    length = int(values.get("max_chain_length", 6))
    stops = max(length - 1, 0) if values.get("learned_stop", True) else 0
    counts = {"subquery": length, "subanswer": length, "stop": stops, "final": 1}
    sampled = values.get("sampled_calls") or list(counts)
    return max(1, sum(counts.get(kind, 0) for kind in sampled))


def _trained_model(values: dict[str, Any]) -> ModelShape:
    model = values.get("model_name_or_path")
    if not model:
        raise InputError("no model to plan for; give --model", field="model_name_or_path")
    return model_shape(str(model))


def _sharding(hw: Hardware, lora: bool) -> str:
    """The hardware's sharding, else ZeRO-3 for full fine-tuning and DDP for LoRA."""
    return hw.sharding or ("ddp" if lora else "zero3")


def _shards(hw: Hardware, lora: bool) -> int:
    """How many processes share each weight: all of them under ZeRO-3/FSDP, one under DDP."""
    return max(1, hw.nodes * hw.gpus) if _sharding(hw, lora) in ("zero3", "fsdp") else 1


def _trainer_items(plan: Plan, values: dict[str, Any], shape: ModelShape, tokens: int) -> list[Item]:
    """One training process's weights, optimizer states and activations for `tokens` tokens a micro-step."""
    hw = plan.hardware
    lora = bool(values.get("use_peft"))
    sharding, shard = _sharding(hw, lora), _shards(hw, lora)
    world = max(1, hw.nodes * hw.gpus)
    fp32 = str(values.get("dtype", "bfloat16")) == "float32" and not values.get("bf16")
    wbytes = 4 if fp32 else 2
    items: list[Item] = []
    if lora:
        adapter = shape.lora_params(
            int(values.get("lora_r", 16)), values.get("lora_target_modules", "all-linear")
        )
        items.append(
            Item(
                f"frozen weights ({wbytes} B/parameter, / {shard})",
                shape.params * wbytes / shard,
                "model_name_or_path",
            )
        )
        items.append(
            Item(
                f"LoRA adapter, its gradients and Adam states ({adapter / 1e6:.0f}M x 16 B)",
                adapter * 16.0 / shard,
                "lora_r",
            )
        )
    else:
        items.append(
            Item(
                f"weights, gradients, Adam states (16 B/parameter, / {shard})",
                shape.params * 16.0 / shard,
                "model_name_or_path",
            )
        )
        if shard > 1:
            gathered = max(2 * shape.params / shape.layers, shape.vocab * shape.hidden) * 2
            items.append(Item("gathered parameters in flight (estimate)", gathered))
    abytes = 4 if fp32 else 2
    per_token = shape.hidden * (shape.layers * abytes + 17 * abytes) if values.get("activation_checkpointing") else (
        shape.hidden * shape.layers * 17 * abytes)  # fmt: skip
    act_name = (
        "checkpointed activations (estimate)"
        if values.get("activation_checkpointing")
        else "activations (estimate)"
    )
    items.append(
        Item(f"{act_name}, {tokens} tokens", tokens * float(per_token), "per_device_train_batch_size")
    )
    plan.notes.append(
        f"{shape.name}: {shape.params / 1e9:.3f}B parameters; {'LoRA' if lora else 'full fine-tuning'} under "
        f"{sharding} over {world} process(es); activations: each layer's input kept ({abytes} B x hidden per "
        f"token and layer) plus one layer recomputed (34 x hidden x 16-bit per token: Korthikanti et al. 2022, "
        "flash attention), an estimate; the loss scores labelled positions only"
    )  # fmt: skip
    return items


def _place_trainer(plan: Plan, items: list[Item], shape: ModelShape) -> None:
    """A training process's items on every GPU (one process each), or in host memory on a CPU machine."""
    hw = plan.hardware
    if hw.gpus:
        for g in range(hw.gpus):
            plan.gpus[g].append(Item("CUDA context (estimate)", CUDA_CONTEXT))
            plan.gpus[g].extend(items)
        plan.host["rank 0"] = [
            Item("Python, torch, dataset pages (estimate)", RUNTIME_HOST),
            Item("full bf16 weights when loading and at the final save", shape.params * 2.0),
        ]
        if hw.gpus > 1 or hw.nodes > 1:
            plan.host["every other rank"] = [Item("Python, torch, dataset pages (estimate)", RUNTIME_HOST)]
    else:
        plan.host["the process"] = [Item("Python, torch, dataset pages (estimate)", RUNTIME_HOST), *items]


def visible_gpu_memory(env: dict[str, str] | None = None) -> list[float]:
    """The total memory (bytes) of each GPU this process sees, in CUDA's order, as nvidia-smi reports it
    (read without initializing CUDA here, so that engines started after the check may still fork);
    [] without a driver. CUDA_VISIBLE_DEVICES (indices or UUIDs) selects and orders them; as in CUDA, the
    list ends at the first entry that names no GPU."""
    env = dict(os.environ) if env is None else env
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in listed.splitlines():
        parts = [part.strip() for part in line.split(",")]
        try:
            gpus.append((parts[0], parts[1], float(parts[2]) * 2**20))
        except (IndexError, ValueError):  # not the queried table (an nvidia-smi too old, or a stand-in)
            return []
    if "CUDA_VISIBLE_DEVICES" not in env:
        return [memory for *_, memory in gpus]
    chosen = []
    for item in env["CUDA_VISIBLE_DEVICES"].split(","):
        found = [
            m
            for index, uuid, m in gpus
            if item.strip() and (item.strip() == index or uuid.startswith(item.strip()))
        ]
        if not found:
            break
        chosen.append(found[0])
    return chosen


def check_visible(stage: str, values: dict[str, Any]) -> None:
    """A command's own check before it loads anything: the stage's plan on the GPUs this process sees,
    each taken as large as the smallest of them. Nothing to check on a machine without GPUs."""
    memories = visible_gpu_memory()
    if not memories:
        return
    count = len(memories)
    if stage == "sample":  # this process is one engine: it sees its own GPUs
        values = {**values, "tensor_parallel_size": min(count, int(values.get("tensor_parallel_size", 1)))}
    plan_stage(stage, values, Hardware(1, count, min(memories))).check()


# Wall time -----------------------------------------------------------------------------------------
#
# A stage's time is the tokens it meters (prompt + generated, as corag.budget counts them) over the
# tokens a second its GPUs process. Every figure below is an estimate; each says where it comes from.

# Tokens per question of CoRAG greedy L=6 with Llama-3.1-8B on the KILT corpus: the CoRAG release's public
# reproduction run (MuSiQue validation, the released checkpoint), the one real 8B figure at hand.
GREEDY_L6_TOKENS = 9_855
# The final-answer call (call C, 20 documents): 2.4k-3.1k tokens measured on HotpotQA passages
# (configs/sft/smollm2-lora.yaml); the top of that range taken.
FINAL_TOKENS = 3_000
# One step's calls (sub-query, then sub-answer over 5 documents): greedy L=6 less the final answer, / 6.
STEP_TOKENS = (GREEDY_L6_TOKENS - FINAL_TOKENS) / 6
# A tree-search step in greedy steps, from the quickstart's tokens per question (docs/benchmarks.md, the
# toy world): greedy L=3 2,239.7 and best-of-4 L=3 7,035.1 (9 steps more) give a step 532.8 and the final
# answer 641.2 tokens; tree search L=3, 9,354.1 = 641.2 + 3 x 5.45 x 532.8.
TREE_STEP_FACTOR = 5.45
# A call without documents (a learned-stop question, the gold answer's score in sampling): the question and
# the chain's sub-queries and sub-answers; an estimate.
SHORT_CALL_TOKENS = 300
# Other methods, measured on real text only with SmolLM2-135M on 30 HotpotQA questions (docs/real_model.md;
# IRCoT without demonstrations, which would lengthen every prompt): a small model's figures.
MEASURED_TOKENS = {"ircot": 1_955, "searchain": 1_147, "one_step": 1_446, "no_retrieval": 104}
# Metered tokens a second per GPU for an 8B model on vLLM on one H100, chosen conservatively: prefill at
# ~50% of the H100's 989 bf16 TFLOPS is ~30k tokens/s (2 x 8.03B FLOPs a token); published vLLM serving
# runs of Llama-3.1-8B reach ~12k generated tokens/s on one H100. CoRAG's calls are mostly prompt but
# short and dependent (each waits for a search), the engine runs at memory fraction 0.5 beside the
# index, and prefix caching (a question's chains share their prompts) is not credited: a sixth of the
# prefill bound. Scaled by 8.03B / the model's parameters and by the GPU's peak / the H100's.
ENGINE_TOKENS_PER_S = 5_000
ENGINE_REFERENCE_PARAMS = 8.03e9
# Training: 6 FLOPs per parameter and token (forward 2, backward 4), 2 more with activation checkpointing;
# LoRA's frozen weights take no weight gradient (backward 2). Model FLOPs utilisation 0.3, below the
# 38-43% that Llama 3's pre-training reports on H100s (Llama 3 paper, Table 4): one node of ZeRO-3 or FSDP
# gathers every layer's weights a micro-step.
MFU = 0.3
# Dense bf16 peak by GPU memory (datasheets): 80 GB taken as an H100 SXM (an A100 80 GB has 312).
GPU_PEAKS = {80: ("H100", 989e12), 141: ("H200", 989e12), 40: ("A100 40 GB", 312e12)}
H100_PEAK = 989e12
# Questions per file when a file is not here, by its folder's dataset and its name: corag/multihopqa's
# published sizes; KILT's dev sets as the KILT paper gives them; KILT's training questions as
# configs/sampling/llama3.1-8b-kilt.yaml counts them (every train split joined, about 1.07M).
KNOWN_QUESTIONS = {
    "multihopqa": {
        "train": 125_385,  # 2Wiki 15,000 + HotpotQA 90,447 + MuSiQue 19,938
        "2wikimultihopqa_validation": 12_576,
        "hotpotqa_validation": 7_405,
        "musique_validation": 2_417,
        "bamboogle_test": 125,
    },
    "kilt": {
        "train": 1_070_000,
        "nq_validation": 2_837,
        "triviaqa_validation": 5_359,
        "hotpotqa_validation": 5_600,
        "fever_validation": 10_444,
        "aidayago2_validation": 4_784,
        "wned_validation": 3_396,
        "cweb_validation": 5_599,
        "trex_validation": 5_000,
        "structured_zeroshot_validation": 3_724,
        "wow_validation": 3_054,
        "eli5_validation": 1_507,
    },
}
# SFT examples: a chain per training question (125,385 multi-hop; about 1.07M KILT), each giving its final
# answer and each step's sub-query and sub-answer at `ratio` 0.2, with chains of 3 steps on average
# (lengths drawn from 1..5; early stops not counted).
MEAN_CHAIN_STEPS = 3


@dataclass
class WallTime:
    """A stage's estimated wall time on its hardware, the arithmetic behind it, and the job's limit."""

    seconds: float | None
    nodes: int
    lines: list[str] = field(default_factory=list)
    limit: float | None = None
    limit_source: str = ""

    def verdict(self) -> str:
        """One line: the estimate against the job's time limit, and what it needs when over."""
        if self.seconds is None:
            return f"wall time: not estimated ({self.lines[0] if self.lines else 'no figures'})"
        took = f"{_hours(self.seconds)} on {self.nodes} node(s)"
        if self.limit is None:
            return f"wall time: {took} (no job time limit known: give --time)"
        if self.seconds <= self.limit:
            return f"wall time: {took}, within the job's limit of {_hours(self.limit)} ({self.limit_source})"
        nodes = math.ceil(self.seconds * self.nodes / self.limit)
        runs = math.ceil(self.seconds / self.limit)
        return (
            f"wall time over the job's limit: {took} against {_hours(self.limit)} ({self.limit_source}); "
            f"one submission needs {nodes} node(s), or {runs} submissions of {self.nodes} (a rerun resumes)"
        )


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def script_limit(stage: str) -> tuple[float | None, str]:
    """The `#SBATCH --time` of the stage's launch script (package data, corag.resources), with where it
    was read."""
    path = stage_script(stage) if stage in ("sample", "evaluate", "sft", "grpo") else None
    if path is None or not path.is_file():
        return None, ""
    for line in path.read_text().splitlines():
        if m := re.match(r"#SBATCH\s+(?:--time=|-t\s*)(\S+)", line.strip()):
            return parse_time(m.group(1)), f"{path.name} #SBATCH --time={m.group(1)}"
    return None, ""


def gpu_peak(hw: Hardware) -> tuple[str, float] | None:
    """(name, dense bf16 FLOP/s) of the hardware's GPUs, told by their memory; None when not known."""
    return GPU_PEAKS.get(card_size(hw.gpu_memory))


def card_size(memory: float) -> int:
    """A card's nominal size in GB from its memory in bytes: its reported total (CARD_MIB) or a size as written."""
    for nominal, mib in CARD_MIB.items():
        if round(memory / 2**20) == mib:
            return nominal
    return round(memory / GB)


def method_tokens(method: str, settings: dict[str, Any]) -> float | None:
    """Metered tokens per question of one method with its settings (an estimate; None: no figure)."""
    steps = int(settings.get("max_steps", 6))
    if method == "greedy":
        return FINAL_TOKENS + steps * STEP_TOKENS
    if method == "best_of_n":
        return FINAL_TOKENS + int(settings.get("n", 4)) * steps * STEP_TOKENS
    if method == "tree_search":
        return FINAL_TOKENS + steps * TREE_STEP_FACTOR * STEP_TOKENS
    if method == "search-r1":  # a turn searches and reads its documents, as a CoRAG step: an assumption
        return int(settings.get("max_turns", 4)) * STEP_TOKENS
    return MEASURED_TOKENS.get(method)


def count_questions(path: str) -> tuple[int | None, str]:
    """Questions in a file: its lines when it is a JSONL file here, else the published size its folder
    (kilt or multihopqa) and name give."""
    p = Path(path)
    if p.is_file() and p.suffix == ".jsonl":
        with p.open("rb") as f:
            return sum(1 for line in f if line.strip()), "counted"
    dataset = "kilt" if "kilt" in str(p.parent).lower() else "multihopqa"
    size = KNOWN_QUESTIONS[dataset].get(p.name.removesuffix(".jsonl"))
    if size is None or (dataset == "multihopqa" and "multihopqa" not in str(p.parent).lower()):
        return None, "not here and of no known size"
    return size, "KILT's size" if dataset == "kilt" else "corag/multihopqa's size"


def engine_rate(shape: ModelShape, hw: Hardware) -> float | None:
    """Metered tokens a second of one GPU's engine for this model on this GPU."""
    peak = gpu_peak(hw)
    if peak is None:
        return None
    return ENGINE_TOKENS_PER_S * ENGINE_REFERENCE_PARAMS / shape.params * peak[1] / H100_PEAK


def train_rate(shape: ModelShape, hw: Hardware, values: dict[str, Any]) -> float | None:
    """Trained tokens a second of one GPU: peak x MFU / FLOPs per token."""
    peak = gpu_peak(hw)
    if peak is None:
        return None
    flops = (4 if values.get("use_peft") else 6) + (2 if values.get("activation_checkpointing") else 0)
    return peak[1] * MFU / (flops * shape.params)


def estimate_wall_time(
    stage: str, values: dict[str, Any], hw: Hardware, data: list[str] | None = None
) -> WallTime:
    """The stage's wall time on `hw` (every node's GPUs together), without the job's limit."""
    wall = WallTime(None, hw.nodes)
    if not hw.gpus:
        wall.lines = ["a CPU machine: the figures are for GPUs; measured CPU times in docs/benchmarks.md"]
        return wall
    if gpu_peak(hw) is None:
        wall.lines = [f"no throughput figure for {card_size(hw.gpu_memory)} GB GPUs (known: 40, 80, 141 GB)"]
        return wall
    gpus = hw.nodes * hw.gpus
    if stage == "evaluate":
        _wall_evaluate(wall, values, hw, gpus, data)
    elif stage == "sample":
        _wall_sample(wall, values, hw, gpus)
    elif stage == "sft":
        _wall_sft(wall, values, hw, gpus)
    elif stage == "grpo":
        _wall_grpo(wall, values, hw, gpus)
    elif stage == "serve":
        _wall_encode(wall, values, hw, gpus)
    return wall


def _questions(wall: WallTime, files: list[str], limit: int | None) -> int | None:
    """The questions of `files` (each at most `limit`), a line each; None when one is not known."""
    total = 0
    for path in files:
        count, source = count_questions(path)
        if count is None:
            wall.lines = [f"{path}: {source}"]
            return None
        count = min(count, limit) if limit else count
        wall.lines.append(f"{path}: {count:,} questions ({source})")
        total += count
    return total


def _wall_evaluate(
    wall: WallTime, values: dict[str, Any], hw: Hardware, gpus: int, data: list[str] | None
) -> None:
    from corag.evaluation import parse_runs

    files = data or [str(values.get("data") or "")]
    questions = _questions(wall, files, values.get("limit"))
    if questions is None:
        return
    per_question = 0.0
    for run in parse_runs(values.get("methods") or []):
        tokens = method_tokens(run.method, run.kwargs)
        if tokens is None:
            wall.lines = [f"no tokens-per-question figure for {run.name}"]
            return
        wall.lines.append(f"{run.name}: {tokens:,.0f} tokens per question")
        per_question += tokens
    shape = model_shape(str(values.get("model")))
    rate = engine_rate(shape, hw) or 0.0
    wall.seconds = questions * per_question / (rate * gpus)
    wall.lines.insert(
        0,
        f"evaluation: {questions:,} questions x {per_question:,.0f} tokens = {questions * per_question / 1e9:.2f}B "
        f"tokens over {gpus} GPUs (every file spread over every GPU of the job) at {rate:,.0f} tokens/s each",
    )


def _wall_sample(wall: WallTime, values: dict[str, Any], hw: Hardware, gpus: int) -> None:
    questions = _questions(wall, [str(values.get("questions") or "")], values.get("limit"))
    if questions is None:
        return
    steps = (int(values.get("min_length", 1)) + int(values.get("max_length", 5))) / 2
    chains = int(values.get("num_chains", 16))
    per_chain = steps * (STEP_TOKENS + SHORT_CALL_TOKENS)
    rate = engine_rate(model_shape(str(values.get("model"))), hw) or 0.0
    total = questions * chains * per_chain
    wall.seconds = total / (rate * gpus)
    wall.lines.insert(
        0,
        f"sampling: {questions:,} questions x {chains} chains x {per_chain:,.0f} tokens ({steps:g} steps of "
        f"{STEP_TOKENS:,.0f} and a {SHORT_CALL_TOKENS}-token score each) = {total / 1e9:.2f}B tokens over "
        f"{gpus} GPUs at {rate:,.0f} tokens/s each",
    )


def sft_examples(values: dict[str, Any]) -> tuple[float | None, str]:
    """Examples of an SFT run and where the figure comes from."""
    source = str(values.get("dataset") or values.get("chains") or "")
    ratio = float(values.get("ratio", 0.2))
    per_chain = 1 + 2 * ratio * MEAN_CHAIN_STEPS
    if values.get("chains") and Path(str(values["chains"])).is_file():
        chains, _ = count_questions(str(values["chains"]))
        return (chains or 0) * per_chain, f"{chains:,} chains in {values['chains']} x {per_chain:g} examples"
    for dataset, name in (("kilt", "KILT"), ("multihopqa", "multi-hop QA")):
        if dataset in source.lower():
            chains = KNOWN_QUESTIONS[dataset]["train"]
            return chains * per_chain, f"{chains:,} {name} chains x {per_chain:g} examples"
    return None, f"no example count for {source or 'the dataset'}"


def _wall_sft(wall: WallTime, values: dict[str, Any], hw: Hardware, gpus: int) -> None:
    examples, source = sft_examples(values)
    if examples is None:
        wall.lines = [source]
        return
    # a chain's tokens (its final answer and `ratio` of its steps' calls) over its examples
    ratio = float(values.get("ratio", 0.2))
    per_example = (FINAL_TOKENS + ratio * MEAN_CHAIN_STEPS * STEP_TOKENS) / (1 + 2 * ratio * MEAN_CHAIN_STEPS)
    epochs = float(values.get("num_train_epochs", 1))
    rate = train_rate(_trained_model(values), hw, values) or 0.0
    total = examples * epochs * per_example
    wall.seconds = total / (rate * gpus)
    wall.lines = [
        f"SFT: {examples:,.0f} examples ({source}) x {epochs:g} epoch(s) x {per_example:,.0f} tokens = "
        f"{total / 1e9:.2f}B tokens over {gpus} GPUs at {rate:,.0f} tokens/s each (MFU {MFU})"
    ]


def _wall_grpo(wall: WallTime, values: dict[str, Any], hw: Hardware, gpus: int) -> None:
    steps = int(values.get("max_steps", 0))
    if steps <= 0:
        wall.lines = ["no max_steps"]
        return
    questions = int(values.get("questions_per_step") or 1)
    chains = int(values.get("num_generations", 8))
    length = int(values.get("max_chain_length", 6))
    stops = max(length - 1, 0) if values.get("learned_stop", True) else 0  # none after the last step
    per_chain = (
        FINAL_TOKENS + length * STEP_TOKENS + 2 * stops * SHORT_CALL_TOKENS
    )  # a decision scores Yes and No
    shape = _trained_model(values)
    rollout, trained = engine_rate(shape, hw) or 0.0, train_rate(shape, hw, values) or 0.0
    total = steps * questions * chains * per_chain
    wall.seconds = total / (rollout * gpus) + total / (trained * gpus)
    wall.lines = [
        f"GRPO: {steps} steps x {questions} questions x {chains} chains x {per_chain:,.0f} tokens (L={length} "
        f"steps, the final answer and the stop decisions) = {total / 1e9:.2f}B tokens, sampled at "
        f"{rollout:,.0f} and trained at {trained:,.0f} tokens/s per GPU over {gpus} GPUs"
    ]


# Passages a second one GPU encodes with E5-large-v2 (335M parameters, passages of ~100 tokens, fp16): about
# 2 x 335M x 100 = 67 GFLOPs a passage, at 15% of an H100's 989 TFLOPS (short sequences, batch 256) ~2,200;
# 2,000 taken. 35.7M passages then take 37 minutes on 8 GPUs (the known rates: 25-50).
ENCODE_PASSAGES_PER_S = 2_000


def _wall_encode(wall: WallTime, values: dict[str, Any], hw: Hardware, gpus: int) -> None:
    """A dense index's encoding (`corag index --shard i --num-shards n`, one process per GPU; the
    service itself runs as long as the stages it serves)."""
    rows, _, source = index_size(values.get("index"))
    if rows == 0:
        wall.lines = ["a service runs as long as the stages it serves (a BM25 index is built on a CPU)"]
        return
    wall.seconds = rows / (ENCODE_PASSAGES_PER_S * gpus)
    wall.lines = [
        f"encoding the index: {rows:,} passages ({source}) at {ENCODE_PASSAGES_PER_S:,} passages/s per GPU "
        f"over {gpus} GPUs (one `corag index --shard` each); the service then runs as long as the stages it serves"
    ]


# What each stage's wall time rests on, by rate: the smoke's measured figure replaces it (calibrate).
CALIBRATED = {
    "sample": ("tokens_per_s_per_engine", "metered tokens/s per engine"),
    "evaluate": ("tokens_per_s_per_engine", "metered tokens/s per engine"),
    "sft": ("tokens_per_s_per_gpu", "trained tokens/s per GPU"),
    "grpo": ("grpo_tokens_per_s_per_gpu", "GRPO tokens/s per GPU (rollouts and training)"),
    "serve": ("passages_per_s_per_gpu", "passages/s encoded per GPU"),
}


def assumed_rate(stage: str, values: dict[str, Any], hw: Hardware) -> float | None:
    """The rate the plan assumes for `stage` (the figure a measured one replaces)."""
    if stage in ("sample", "evaluate"):
        return engine_rate(model_shape(str(values.get("model"))), hw)
    shape = _trained_model(values) if stage in ("sft", "grpo") else None
    if stage == "sft":
        return train_rate(shape, hw, values)
    if stage == "grpo":  # a step samples, then trains, the same tokens
        rollout, trained = engine_rate(shape, hw), train_rate(shape, hw, values)
        return 1 / (1 / rollout + 1 / trained) if rollout and trained else None
    return ENCODE_PASSAGES_PER_S if stage == "serve" else None


def calibrate_wall_time(
    stage: str, values: dict[str, Any], hw: Hardware, wall: WallTime, measured: dict[str, float], where: str
) -> WallTime:
    """`wall` with the smoke's measured rate of `stage` in place of the assumed one (the time scales as
    assumed / measured), each figure marked measured or assumed."""
    if wall.seconds is None or stage not in CALIBRATED:
        return wall
    key, what = CALIBRATED[stage]
    assumed = assumed_rate(stage, values, hw)
    rate = measured.get(key)
    if not rate or not assumed:
        wall.lines.append(f"assumed: {what} (the smoke measured none)")
        return wall
    wall.seconds *= assumed / rate
    wall.lines.append(
        f"measured: {rate:,.0f} {what} ({where}) in place of the assumed {assumed:,.0f}; the stage's other "
        "figures (tokens per question, per chain, per example) are assumed"
    )
    if stage == "sft" and measured.get("mfu"):
        wall.lines.append(f"measured: MFU {measured['mfu']:.1%} in place of the assumed {MFU:.0%}")
    return wall
