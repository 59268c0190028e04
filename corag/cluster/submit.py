"""Whether a Slurm job can ever start: what a batch script's #SBATCH lines and sbatch's flags ask of a
node, against the nodes `sinfo` lists. sbatch accepts a job that asks more CPUs, memory or GPUs a node
than any node of its partition has, and the job then waits for good (Reason=PartitionConfig)."""

from __future__ import annotations

import math
import re
import subprocess
from dataclasses import dataclass, field

from corag.errors import InputError

# Exact node groups (-e: no "250+" minimums): partition (default marked *), node count, CPUs, memory in
# MB (RealMemory), generic resources (gpu:8, gpu:a100:4(S:0-1), (null)), the partition's time limit
# (MaxTime: 1:00:00, 2-00:00:00, infinite) and the nodes' state (idle, mixed, drained, down*, ...).
SINFO = ("sinfo", "-h", "-e", "-o", "%P %D %c %m %G %l %t")
# Node states no job starts on (sinfo's short names, without the * of a node not responding).
UNUSABLE = (
    "down",
    "drain",
    "drng",
    "fail",
    "failg",
    "inval",
    "maint",
    "futr",
    "unk",
    "boot",
    "pow_dn",
    "npc",
)

# The sbatch options that size a job, by every name sbatch takes for them.
OPTIONS = {
    "--nodes": "nodes", "-N": "nodes",
    "--ntasks": "ntasks", "-n": "ntasks",
    "--ntasks-per-node": "ntasks-per-node",
    "--cpus-per-task": "cpus-per-task", "-c": "cpus-per-task",
    "--cpus-per-gpu": "cpus-per-gpu",
    "--mem": "mem",
    "--mem-per-cpu": "mem-per-cpu",
    "--mem-per-gpu": "mem-per-gpu",
    "--gpus": "gpus", "-G": "gpus",
    "--gpus-per-node": "gpus-per-node",
    "--gres": "gres",
    "--partition": "partition", "-p": "partition",
    "--time": "time", "-t": "time",
    "--signal": "signal",
}  # fmt: skip


@dataclass
class NodeGroup:
    """Nodes of one partition alike in CPUs, memory (MB) and GPUs (count by type; None: untyped)."""

    partition: str
    count: int
    cpus: int
    memory_mb: int
    gpus: dict[str | None, int] = field(default_factory=dict)
    max_time: float | None = None  # seconds; None: no limit (or not listed)
    state: str = "idle"

    @property
    def usable(self) -> bool:
        """Whether jobs start on these nodes (not down, drained, failed, ...)."""
        return self.state.rstrip("*~#!%$@^-") not in UNUSABLE

    def gpu_count(self, kind: str | None) -> int:
        """GPUs of `kind` on one node (any kind when None)."""
        return sum(self.gpus.values()) if kind is None else self.gpus.get(kind, 0)


@dataclass
class Request:
    """What a job asks of each node, and the option that asked it (`--mem=512G`, `#SBATCH --mem=512G`)."""

    nodes: int = 1
    cpus: int = 1
    memory_mb: int | None = None  # None: not asked, or all of a node's (--mem=0)
    gpus: int = 0
    gpu_kind: str | None = None
    total_gpus: int = 0  # --gpus without a node count: over the job's nodes
    partitions: tuple[str, ...] = ()
    time_s: float | None = None  # --time
    asked_by: dict[str, str] = field(default_factory=dict)


def header_options(script: str) -> list[str]:
    """The words of a batch script's #SBATCH lines (sbatch reads them up to the first command)."""
    words: list[str] = []
    for line in script.splitlines()[1:]:
        if line.startswith("#SBATCH"):
            words += line.split("#", 2)[1].split()[1:]
        elif line.strip() and not line.startswith("#"):
            break
    return words


def sizing_options(words: list[str], source: str = "") -> dict[str, tuple[str, str]]:
    """The sizing options among sbatch words (`--mem=4G`, `--mem 4G`, `-c 4`, `-c4`): option -> (value,
    the words as given, after `source`); later words win, as sbatch's do."""
    found: dict[str, tuple[str, str]] = {}
    i = 0
    while i < len(words):
        name, eq, value = words[i].partition("=")
        if name in OPTIONS and not eq and i + 1 < len(words):
            found[OPTIONS[name]] = (words[i + 1], f"{source}{name} {words[i + 1]}")
            i += 1
        elif name in OPTIONS and eq:
            found[OPTIONS[name]] = (value, f"{source}{words[i]}")
        elif name[:2] in OPTIONS and len(name) > 2 and name[1] != "-":  # -c4
            found[OPTIONS[name[:2]]] = (words[i][2:], f"{source}{words[i]}")
        i += 1
    return found


def memory_mb(text: str, asked_by: str) -> int:
    """Megabytes in sbatch's sizes: 4000, 4000M, 64G, 1T, 512K (no unit: MB)."""
    m = re.fullmatch(r"(\d+)([KMGT]?)B?", text.strip(), re.IGNORECASE)
    if not m:
        raise InputError(f"{asked_by}: expected a size such as 64G or 4000M")
    power = "KMGT".index(m.group(2).upper() or "M") - 1
    return math.ceil(int(m.group(1)) * 1024**power)


def gpu_ask(text: str, asked_by: str) -> tuple[str | None, int]:
    """`8` or `a100:8` (--gpus, --gpus-per-node) -> (kind, count)."""
    kind, _, count = text.rpartition(":")
    if not count.isdigit():
        raise InputError(f"{asked_by}: expected a GPU count such as 8 or a100:8")
    return kind or None, int(count)


def number(text: str, asked_by: str) -> int:
    """A count such as 4, or the least of a range such as 2-4 (--nodes)."""
    least = text.split("-")[0]
    if not least.isdigit():
        raise InputError(f"{asked_by}: expected a number")
    return int(least)


def parse_time(text: str, asked_by: str = "--time") -> float:
    """Seconds in a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    m = re.fullmatch(r"\s*(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?\s*", text)
    if not m:
        raise InputError(
            f"expected a Slurm time such as 12:00:00 or 1-00:00:00, got {text!r}", field=asked_by
        )
    days, a, b, c = (int(g) if g else None for g in m.groups())
    if days is not None:  # D-HH[:MM[:SS]]
        return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:
        return a * 3600 + b * 60 + c
    return a * 60 + (b or 0)  # MM or MM:SS


def warning_margin(text: str) -> float | None:
    """Seconds before the time limit that `--signal=[B:]USR1@SECONDS` warns at (None: no USR1 warning)."""
    m = re.fullmatch(r"(?:[A-Z]+:)?(?:SIG)?USR1(?:@(\d+))?", text.strip(), re.IGNORECASE)
    return None if not m else float(m.group(1) or 60)


def check_margin(time_s: float, margin_s: float, time_by: str, signal_by: str) -> None:
    """A job warned `margin_s` before a limit of `time_s` or less is warned at once in every run: it would
    spend its requeues without a step, so it is refused in one line."""
    if time_s <= margin_s:
        raise InputError(
            f"{time_by} ({time_s / 60:g} min) is not longer than the warning margin of {signal_by} "
            f"({margin_s / 60:g} min): every run would be warned at once and stop; ask more time, or a "
            "smaller margin with --signal=B:USR1@SECONDS"
        )


def parse_request(header: list[str], flags: list[str]) -> Request:
    """The per-node request of a job from its script's #SBATCH words and sbatch's flags (which win)."""
    found = {**sizing_options(header, "#SBATCH "), **sizing_options(flags)}
    asked = {key: by for key, (_, by) in found.items()}
    value = {key: v for key, (v, _) in found.items()}
    request = Request(asked_by=asked)
    if "time" in value:
        request.time_s = (
            parse_time(value["time"], asked["time"])
            if value["time"] not in ("infinite", "UNLIMITED")
            else None
        )
        if request.time_s is not None and "signal" in value and (margin := warning_margin(value["signal"])):
            check_margin(request.time_s, margin, asked["time"], asked["signal"])
    if "partition" in value:
        request.partitions = tuple(p for p in value["partition"].split(",") if p)
    if "nodes" in value:
        request.nodes = number(value["nodes"], asked["nodes"])
    if "gpus-per-node" in value:
        request.gpu_kind, request.gpus = gpu_ask(value["gpus-per-node"], asked["gpus-per-node"])
        asked["gpus"] = asked["gpus-per-node"]
    elif "gres" in value:
        for kind, count in parse_gres(value["gres"]).items():
            request.gpu_kind, request.gpus = kind, count
            asked["gpus"] = asked["gres"]
    elif "gpus" in value:
        kind, count = gpu_ask(value["gpus"], asked["gpus"])
        request.gpu_kind = kind
        if "nodes" in value:
            request.gpus = math.ceil(count / request.nodes)
        else:
            request.total_gpus = count
    tasks = 1
    if "ntasks-per-node" in value:
        tasks = number(value["ntasks-per-node"], asked["ntasks-per-node"])
        asked["cpus"] = asked["ntasks-per-node"]
    elif "ntasks" in value and "nodes" in value:
        tasks = math.ceil(number(value["ntasks"], asked["ntasks"]) / request.nodes)
    request.cpus = tasks
    if "cpus-per-task" in value:
        request.cpus = tasks * number(value["cpus-per-task"], asked["cpus-per-task"])
        asked["cpus"] = asked["cpus-per-task"]
    elif "cpus-per-gpu" in value:
        request.cpus = max(1, request.gpus) * number(value["cpus-per-gpu"], asked["cpus-per-gpu"])
        asked["cpus"] = asked["cpus-per-gpu"]
    if "mem" in value:
        request.memory_mb = memory_mb(value["mem"], asked["mem"]) or None
        asked["memory"] = asked["mem"]
    elif "mem-per-cpu" in value:
        request.memory_mb = request.cpus * memory_mb(value["mem-per-cpu"], asked["mem-per-cpu"])
        asked["memory"] = asked["mem-per-cpu"]
    elif "mem-per-gpu" in value and request.gpus:
        request.memory_mb = request.gpus * memory_mb(value["mem-per-gpu"], asked["mem-per-gpu"])
        asked["memory"] = asked["mem-per-gpu"]
    return request


def parse_gres(text: str) -> dict[str | None, int]:
    """GPUs by kind in a generic-resource list: `gpu:8`, `gpu:a100:4(S:0-1)`, `gpu:a100:2,gpu:v100:2`,
    `gpu:8,shard:16`, `(null)` (no GPUs)."""
    gpus: dict[str | None, int] = {}
    for entry in re.sub(r"\([^)]*\)", "", text).split(","):
        parts = entry.strip().split(":")
        if parts[0] != "gpu":
            continue
        count = int(parts[-1]) if parts[-1].isdigit() else 1
        kind = parts[1] if len(parts) == 3 else None
        gpus[kind] = gpus.get(kind, 0) + count
    return gpus


def parse_sinfo(text: str) -> tuple[list[NodeGroup], str | None]:
    """Node groups from `sinfo -h -e -o '%P %D %c %m %G %l %t'` (SINFO; the last two may be missing), and
    the default partition."""
    groups, default = [], None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) not in (5, 6, 7) or not all(p.isdigit() for p in parts[1:4]):
            raise InputError(
                f"sinfo's line {n} is not PARTITION NODES CPUS MEMORY GRES [TIMELIMIT STATE]: {line.strip()!r}"
            )
        partition = parts[0].rstrip("*")
        if parts[0].endswith("*"):
            default = partition
        limit = parts[5] if len(parts) > 5 else "infinite"
        max_time = (
            None if limit in ("infinite", "UNLIMITED", "n/a") else parse_time(limit, f"sinfo's line {n}")
        )
        group = NodeGroup(
            partition, int(parts[1]), int(parts[2]), int(parts[3]), parse_gres(parts[4]), max_time
        )
        group.state = parts[6] if len(parts) > 6 else "idle"
        groups.append(group)
    return groups, default


def describe(cpus: int, memory: int | None, gpus: int, kind: str | None) -> str:
    """`8 GPU(s), 64 CPU(s) and 512000 MB`: what is asked of a node."""
    parts = [f"{gpus} {kind + ' ' if kind else ''}GPU(s)"] if gpus else []
    parts.append(f"{cpus} CPU(s)")
    if memory:
        parts.append(f"{memory} MB")
    return ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else parts[0]


def check_partition(request: Request, groups: list[NodeGroup], partition: str) -> None:
    """An InputError naming every option no node of `groups` can meet, with the partition's most (each
    resource alone and --time against the partition's MaxTime); then the resources together, then enough
    such nodes. Nodes that are down or drained count for nothing."""
    asked = request.asked_by
    usable = [g for g in groups if g.usable]
    if not usable:
        states = ", ".join(sorted({g.state for g in groups}))
        raise InputError(
            f"every node of partition {partition!r} is out of service ({states}); no job starts there"
        )
    needs = (
        ("gpus", request.gpus, lambda g: g.gpu_count(request.gpu_kind), "GPU(s)", request.gpu_kind),
        ("cpus", request.cpus, lambda g: g.cpus, "CPU(s)", None),
        ("memory", request.memory_mb or 0, lambda g: g.memory_mb, "MB of memory", None),
    )
    problems = []
    for key, need, have, unit, kind in needs:
        most = max(have(g) for g in usable)
        if need > most:
            what = f"{kind} {unit}" if kind else unit
            problems.append(
                f"{asked.get(key, 'the job')} asks {need} {what} a node, and no node of partition {partition!r} "
                f"has more than {most}, so it could never start; ask at most {most} {what}"
            )
    limits = [g.max_time for g in usable]
    if request.time_s is not None and None not in limits and request.time_s > max(limits):
        most = max(limits)
        problems.append(
            f"{asked['time']} asks {request.time_s / 3600:g} h, over partition {partition!r}'s time limit of "
            f"{most / 3600:g} h, so it would wait for good (PartitionTimeLimit); ask at most {most / 3600:g} h"
        )
    if problems:
        raise InputError("; and ".join(problems))
    fits = [g for g in usable if all(need <= have(g) for _, need, have, _, _ in needs)]
    want = describe(request.cpus, request.memory_mb, request.gpus, request.gpu_kind)
    if not fits:
        raise InputError(f"no node of partition {partition!r} has {want} together; ask less of one")
    nodes = sum(g.count for g in fits)
    if request.nodes > nodes:
        raise InputError(
            f"{asked['nodes']} asks {request.nodes} nodes of {want}, and partition {partition!r} has {nodes}"
        )
    total = sum(g.count * g.gpu_count(request.gpu_kind) for g in fits)
    if request.total_gpus > total:
        raise InputError(
            f"{asked['gpus']} asks {request.total_gpus} GPUs, and partition {partition!r} has {total}"
        )


def check(request: Request, groups: list[NodeGroup], default: str | None) -> str:
    """The first of the job's partitions (else the default one) some node of which can run it; otherwise
    the InputError of the first partition asked."""
    known = sorted({g.partition for g in groups})
    partitions = request.partitions or ((default,) if default else ())
    if not partitions:
        raise InputError(f"sinfo names no default partition; pass --partition (one of {', '.join(known)})")
    errors = []
    for partition in partitions:
        members = [g for g in groups if g.partition == partition]
        if not members:
            errors.append(InputError(f"no partition {partition!r}; sinfo lists {', '.join(known) or 'none'}"))
            continue
        try:
            check_partition(request, members, partition)
            return partition
        except InputError as e:
            errors.append(e)
    raise errors[0]


def node_groups() -> tuple[list[NodeGroup], str | None]:
    """The cluster's node groups and default partition, from sinfo (SINFO)."""
    try:
        done = subprocess.run(SINFO, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise InputError("no sinfo here: run corag where Slurm's commands are (a login node)") from None
    if done.returncode:
        raise InputError(f"sinfo failed: {(done.stderr.strip().splitlines() or ['no message'])[0]}")
    return parse_sinfo(done.stdout)
