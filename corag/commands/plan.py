"""`corag plan`: the memory plan of a stage's config on some GPUs, refused in one line if it cannot fit,
and the stage's estimated wall time against its job's time limit.

Per GPU it lists model weights and the vLLM engine's share, dense index shards, the SFT recipe's
weights, gradients, Adam states and activations, and host memory per process (corag.plan). The
hardware comes from the flags or, when they are not given, from the config's `# hardware:` line; a
`# beside: corag serve-retriever ...` line adds the retrieval service that shares the node's GPUs.
The config is read with the dataclasses of the stage's own command or recipe, so a key or value they
refuse is refused here too. The wall time is questions (or examples, or steps) x tokens each over the
GPUs' throughput (corag.plan's figures, each with its source), over every GPU of every node; one line
says when it passes the job's limit (the stage's launch script's `#SBATCH --time`, or `--time`) and how
many nodes or submissions it needs. An iterate config (`rounds:`) under `launcher: slurm` is planned as
the stage configs it names, each on the nodes its sbatch flags ask for.
"""

from __future__ import annotations

import importlib
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corag.config import load_yaml, parse_config, read_config
from corag.errors import InputError
from corag.plan import (
    SHARDINGS,
    STAGES,
    Hardware,
    WallTime,
    calibrate_wall_time,
    card_memory,
    detect_stage,
    estimate_wall_time,
    parse_memory,
    parse_time,
    plan_stage,
    read_header,
    script_limit,
)
from corag.smoke import memory_flags, read_smoke

# stage -> the config dataclasses its command or recipe parses ("module:attribute", imported when planned)
STAGE_CONFIGS: dict[str, str] = {
    "sample": "corag.commands.sample:CONFIGS",
    "evaluate": "corag.commands.evaluate:CONFIGS",
    "serve": "corag.commands.serve_retriever:CONFIGS",
    "sft": "corag.recipes.sft:CONFIGS",
    "grpo": "corag.recipes.grpo:CONFIGS",
}


@dataclass
class PlanArgs:
    config_file: str = field(metadata={"positional": True, "help": "the stage's config (YAML)"})
    gpus: int | None = field(default=None, metadata={"help": "GPUs per node (default: the config's header)"})
    gpu_memory: str | None = field(
        default=None,
        metadata={
            "help": "memory of each GPU: 80GB, 141GB (the card's reported total: 81,559 and 143,771 MiB), 80GiB"
        },
    )
    nodes: int | None = field(default=None, metadata={"help": "nodes (default: the header's, else 1)"})
    host_memory: str | None = field(
        default=None, metadata={"help": "host memory of a node (checked if given)"}
    )
    stage: str | None = field(
        default=None, metadata={"choices": list(STAGES), "help": "default: told by the config's keys"}
    )
    sharding: str | None = field(
        default=None,
        metadata={"choices": list(SHARDINGS), "help": "SFT: zero3/fsdp shard states over the world, ddp keeps "
        "them whole (default: the header's, else zero3 for full fine-tuning and ddp for LoRA)"},
    )  # fmt: skip
    model: str | None = field(default=None, metadata={"help": "model, when the config names none"})
    time: str | None = field(
        default=None,
        metadata={"help": "the job's time limit, as sbatch takes it (default: the stage's launch script's "
        "#SBATCH --time)"},
    )  # fmt: skip
    calibrate: str | None = field(
        default=None,
        metadata={"help": "smoke.json of a `corag smoke` that ran this config: its measured rates replace "
        "the assumed ones in the wall time, and a stage whose memory passed its plan by more than a tenth is named"},
    )  # fmt: skip
    data: list[str] | None = field(
        default=None,
        metadata={"action": "extend", "help": "evaluation: the question files of the job (as "
        "evaluation/slurm_eval.sh takes them, --data A --data B or --data A B; default: the config's data)"},
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    # `--config FILE` reads as the positional: the config is what is planned, not a source of flags.
    argv = ["--config_file" if a == "--config" else a for a in (argv or [])]
    argv = [a for a in argv if a != "--config_file"] if "--config_file" in argv else argv
    args = parse_config(PlanArgs, argv, __doc__.splitlines()[0])
    if "rounds" in load_yaml(args.config_file):
        return plan_iterate(args)
    stage = args.stage or detect_stage(load_yaml(args.config_file), args.config_file)
    values = stage_values(stage, args.config_file, args.model)
    smoke = read_smoke(args.calibrate, args.config_file) if args.calibrate else None
    header, service = read_header(args.config_file)
    hw = header or Hardware()
    if args.gpus is not None or args.gpu_memory is not None:
        if args.gpus is None or args.gpu_memory is None:
            raise InputError("give --gpus and --gpu-memory together", field="--gpus")
        hw = Hardware(hw.nodes, args.gpus, card_memory(args.gpu_memory), hw.host_memory, hw.sharding)
    elif header is None:
        raise InputError("no `# hardware:` line: give --gpus and --gpu-memory", file=args.config_file)
    if args.nodes is not None:
        hw.nodes = args.nodes
    if args.host_memory is not None:
        hw.host_memory = parse_memory(args.host_memory)
    if args.sharding is not None:
        hw.sharding = args.sharding
    plan = plan_stage(stage, values, hw, service=service, file=args.config_file)
    print(plan.table())
    plan.check()
    wall = wall_time(stage, values, hw, args)
    if smoke is not None:
        ran, result, record = smoke
        measured = result.get("rates", {}) if ran == stage else {}
        where = f"corag smoke on {record.get('device', '?')}, {result.get('seconds', 0):.0f} s"
        wall = calibrate_wall_time(stage, values, hw, wall, measured, where)
        print(
            memory_flags(record["stages"]) or "memory: no stage of the smoke passed its plan by more than 10%"
        )
    if wall.seconds is not None:
        print("\n".join(f"- {line}" for line in wall.lines))
    print(wall.verdict())
    print(plan.summary())
    return 0


def wall_time(stage: str, values: dict[str, Any], hw: Hardware, args: PlanArgs) -> WallTime:
    """The stage's wall time on `hw` against the job's limit (`--time`, else the launch script's)."""
    wall = estimate_wall_time(stage, values, hw, args.data)
    if args.time is not None:
        wall.limit, wall.limit_source = parse_time(args.time), f"--time {args.time}"
    else:
        wall.limit, wall.limit_source = script_limit(stage)
    return wall


def stage_values(stage: str, config_file: str, model: str | None) -> dict[str, Any]:
    """Every setting of `stage` as its command or recipe reads `config_file` (defaults filled in, `model`
    given as its model flag); refused in one line where they would refuse it."""
    module, name = STAGE_CONFIGS[stage].split(":")
    flag = "--model_name_or_path" if stage in ("sft", "grpo") else "--model"
    flags = [flag, model] if model is not None and stage != "serve" else []
    classes = getattr(importlib.import_module(module), name)
    return read_config(classes, ["--config", config_file, *flags])


# An iterate config's stages under `launcher: slurm`: (stage, its config key, its sbatch flags' key).
ITERATE_STAGES = (
    ("sample", "sampling_config", "sample_sbatch"),
    ("sft", "sft_config", "train_sbatch"),
    ("evaluate", "eval_config", "eval_sbatch"),
)


def plan_iterate(args: PlanArgs) -> int:
    """An iterate config (corag iterate): with `launcher: slurm`, each stage's config it names, planned on
    the nodes its sbatch flags ask for (the sampling array's tasks, the SFT and evaluation jobs' --nodes)
    unless --nodes is given, SFT from its `model` and evaluation on its `eval_data`. The pool job (one
    sampling engine on one GPU, scoring chains) is not planned, and evaluation is planned with the eval
    config's methods (the round's may be fewer). With `launcher: local` there is nothing to
    plan on GPUs: one line says so."""
    from corag.iterate import IterateConfig
    from corag.sampling import SamplingConfig

    cfg, _ = parse_config((IterateConfig, SamplingConfig), ["--config", args.config_file])
    if cfg.launcher != "slurm":
        print(
            f"{args.config_file}: launcher {cfg.launcher} runs every stage on this machine; nothing to plan"
        )
        return 0
    flags = [
        *(["--gpus", str(args.gpus)] if args.gpus is not None else []),
        *(["--gpu-memory", args.gpu_memory] if args.gpu_memory is not None else []),
        *(["--host-memory", args.host_memory] if args.host_memory is not None else []),
    ]
    for stage, key, sbatch in ITERATE_STAGES:
        config = getattr(cfg, key)
        if not config or not Path(config).is_file():
            raise InputError(f"no stage config to plan, not found from {Path.cwd()}", file=config, field=key)
        nodes = args.nodes or sbatch_nodes(getattr(cfg, sbatch))
        given = {"sft": ["--model", cfg.model or ""], "evaluate": ["--data", cfg.eval_data or ""]}.get(
            stage, []
        )
        print(f"== {stage}: {config} on {nodes} node(s)")
        main(["--config", config, "--nodes", str(nodes), *flags, *[w for w in given if w]])
    print(
        f"plan fits: every stage of a round of {args.config_file} (sample, sft, evaluate; the pool job not planned)"
    )
    return 0


def sbatch_nodes(flags: str) -> int:
    """The nodes sbatch `flags` ask for: an array's tasks (one node each, `--array=0-1,4`), else `--nodes`
    (or -N), else 1."""
    words = shlex.split(flags)
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
        if name in ("--array", "-a"):
            count = 0
            for part in value.split("%")[0].split(","):
                span, _, step = part.partition(":")
                first, _, last = span.partition("-")
                count += (int(last or first) - int(first)) // int(step or 1) + 1
            return count
        if name in ("--nodes", "-N"):
            return int(value.split("-")[0])
    return 1
