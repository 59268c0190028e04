"""The node launcher (`sampling/launch_node.sh`): the shards of a sampling run on this node's devices.

    sampling/launch_node.sh CONFIG [--node-index I] [--num-nodes N] [--num-shards S]
                            [--tensor-parallel-size T] [--log-dir logs]
                            [--serve-index INDEX | --retriever-url-file FILE] [--wait-minutes M]
                            [-- flags for corag sample]

The run's shards are fixed by the config (`num_shards`), never by the hardware: node I of N runs
engines on its devices, `tensor_parallel_size` devices each, and engine e of the W = N x engines
workers of the run samples shards e, e + W, e + 2W, ... one after another. Resubmitting on other nodes,
or with another number of GPUs, keeps every shard's name, so unfinished shards resume and the merge
finds them all.

The devices are the allocation's: CUDA_VISIBLE_DEVICES as Slurm (or the user) set it, else Slurm's
SLURM_STEP_GPUS / SLURM_JOB_GPUS (renumbered from 0 where the job sees only its own GPUs), else every
GPU `nvidia-smi` lists; none at all runs one engine on the CPU. Each engine gets its devices as CUDA_VISIBLE_DEVICES, a subset of what the allocation gave.

With `--serve-index INDEX` (the shipped configs' layout), the launcher first starts this node's
retrieval service over INDEX (corag.cluster.node_service: the index's shards over the node's GPUs, on
loopback), waits until it answers, gives every shard `--retriever URL`, and stops it when the shards end;
its log is `<log-dir>/retriever-<job>-node<I>.log`. The engines start after it, into the memory it leaves.
Shard logs are `<log-dir>/sample-<job>-shard-<S>.log`; <job> is the Slurm job (ARRAY_TASK for an array
task; left out of the names outside Slurm), and a requeued job appends to its own logs.

On SIGUSR1 (Slurm's warning before the time limit, passed on by the batch shell) every running shard
finishes the block in hand and stops, no further shard starts, and the launcher exits with status 75
(corag.cluster.stop.stopped): the batch shell requeues the job and the rerun resumes every unfinished shard.

With `--retriever-url-file` (a service on a node of its own), the launcher first waits (at most `--wait-minutes`) for the file a
retrieval service job writes (sampling/serve_retriever.sh) and for that service to answer, then gives
every shard `--retriever URL`: the URL is read when the job runs, not when it is submitted.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corag.cluster.node_service import node_service
from corag.cluster.stop import STOPPED, WARNING_SIGNAL, job_tag, stopped
from corag.config import load_yaml, parse_config
from corag.errors import InputError
from corag.retrieval.client import wait_for_service


def visible_devices(env: Mapping[str, str]) -> list[str] | None:
    """The GPUs this node may use, as CUDA_VISIBLE_DEVICES entries, or None when there are none.

    Slurm's SLURM_STEP_GPUS / SLURM_JOB_GPUS hold physical ids; where the job's cgroup shows only its own
    GPUs (nvidia-smi lists exactly as many), CUDA numbers them 0..n-1, so those are used instead.
    """
    if "CUDA_VISIBLE_DEVICES" in env:
        devices = [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
        return devices if devices and devices != ["-1"] else None
    listed = _listed_gpus()
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if name in env:
            devices = [d.strip() for d in env[name].split(",") if d.strip()]
            if not devices:
                return None
            return [str(i) for i in range(len(devices))] if listed == len(devices) else devices
    return [str(i) for i in range(listed)] or None


def _listed_gpus() -> int:
    """How many GPUs nvidia-smi lists here (0 without a driver)."""
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listed.splitlines() if line.startswith("GPU "))


def engine_devices(devices: list[str] | None, tensor_parallel_size: int) -> list[list[str] | None]:
    """The devices of each engine on this node: consecutive groups of `tensor_parallel_size`."""
    if tensor_parallel_size < 1:
        raise InputError(f"must be at least 1, got {tensor_parallel_size}", field="tensor_parallel_size")
    if devices is None:
        return [None]
    if len(devices) < tensor_parallel_size:
        raise InputError(
            f"this node has {len(devices)} GPU(s) ({','.join(devices)}), an engine needs "
            f"{tensor_parallel_size}",
            field="tensor_parallel_size",
        )
    engines = len(devices) // tensor_parallel_size
    if engines * tensor_parallel_size < len(devices):
        unused = devices[engines * tensor_parallel_size :]
        print(
            f"launch: GPU(s) {','.join(unused)} left unused (tensor_parallel_size {tensor_parallel_size})",
            file=sys.stderr,
        )
    return [devices[e * tensor_parallel_size : (e + 1) * tensor_parallel_size] for e in range(engines)]


def worker_shards(worker: int, workers: int, num_shards: int) -> list[int]:
    """The shards one engine of the run samples, in order."""
    return list(range(worker, num_shards, workers))


def _split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The launcher's own arguments and the flags after `--` (passed to every shard)."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


@dataclass
class LaunchArgs:
    config: str = field(
        metadata={"positional": True, "help": "sampling config (YAML); its num_shards names the run's shards"}
    )
    node_index: int = field(default=0, metadata={"help": "this node's index in the run (from 0)"})
    num_nodes: int = field(default=1, metadata={"help": "nodes that run this config together"})
    num_shards: int | None = field(default=None, metadata={"help": "override the config's num_shards"})
    tensor_parallel_size: int | None = field(
        default=None, metadata={"help": "GPUs per engine (default: the config's)"}
    )
    serve_index: str | None = field(
        default=None,
        metadata={"help": "start this node's retrieval service over this index; every shard gets its URL"},
    )
    retriever_url_file: str | None = field(
        default=None,
        metadata={"help": "wait for the URL file a retrieval service job writes, then pass --retriever URL"},
    )
    wait_minutes: float = field(
        default=30.0, metadata={"help": "how long to wait for the service (its URL file, its index load)"}
    )
    log_dir: str = field(default="logs", metadata={"help": "one log file per shard (created when missing)"})
    command: str = field(
        default_factory=lambda: os.environ.get(
            "CORAG_LAUNCH_COMMAND", f"{shlex.quote(sys.executable)} -m corag.cli sample"
        ),
        metadata={"help": "the program each shard runs (default: $CORAG_LAUNCH_COMMAND, else this Python's "
        "`corag sample`)"},
    )  # fmt: skip


def _parse(argv: Sequence[str]) -> tuple[LaunchArgs, list[str]]:
    own, passed = _split(argv)
    args = parse_config(LaunchArgs, own, __doc__.splitlines()[0])
    if args.serve_index and args.retriever_url_file:
        raise InputError("give --serve-index or --retriever-url-file, not both", field="--serve-index")
    if not 0 <= args.node_index < args.num_nodes:
        raise InputError(
            f"need 0 <= node index < --num-nodes, got {args.node_index} and {args.num_nodes}",
            field="--node-index",
        )
    return args, passed


def _setting(args: LaunchArgs, values: dict, name: str, default: int | None) -> int:
    given = getattr(args, name)
    value = given if given is not None else values.get(name, default)
    if value is None:
        raise InputError(
            f"set {name} in the config (or --{name.replace('_', '-')}): shard names must not depend on "
            "how many GPUs a node has",
            file=args.config,
            field=name,
        )
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(f"must be a positive integer, got {value!r}", file=args.config, field=name)
    return value


def check_config(args: LaunchArgs) -> tuple[int, int]:
    """The config's num_shards and tensor_parallel_size as the launcher takes them, or an InputError."""
    values = load_yaml(args.config)
    return _setting(args, values, "num_shards", None), _setting(args, values, "tensor_parallel_size", 1)


class Shards:
    """The shard processes running on this node, and whether the warning signal asked them to stop."""

    def __init__(self) -> None:
        self.running: list[subprocess.Popen] = []
        self.stopping = False
        self.lock = threading.Lock()

    def warn(self, signum: int, frame: object) -> None:
        """The warning signal: pass it on to every running shard; start no other."""
        with self.lock:
            self.stopping = True
            for proc in self.running:
                if proc.poll() is None:
                    proc.send_signal(signum)

    def run(self, command: list[str], env: dict[str, str], log: Path) -> int | None:
        """One shard's exit status, or None when it was not started (the warning came first)."""
        with self.lock:
            if self.stopping:
                return None
            out = open(log, "ab")  # noqa: SIM115 (closed below, once the shard ends)
            proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
            self.running.append(proc)
        with out:
            return proc.wait()


def log_name(stem: str, what: str, env: Mapping[str, str]) -> str:
    """`stem-<job>-what.log`, the job as corag.cluster.stop.job_tag names it; `stem-what.log` outside Slurm."""
    tag = job_tag(env)
    return f"{stem}-{tag}-{what}.log" if tag else f"{stem}-{what}.log"


def _run_worker(
    shards_run: Shards,
    command: list[str],
    shards: list[int],
    env: dict[str, str],
    log_dir: Path,
    failed: list[int],
    halted: list[int],
) -> None:
    """Sample `shards` one after another with one engine; a failed shard is recorded, the next one runs;
    after the warning signal, the shard in hand stops (recorded in `halted`) and no other starts."""
    for shard in shards:
        log = log_dir / log_name("sample", f"shard-{shard:05d}", env)
        code = shards_run.run([*command, "--shard", str(shard)], env, log)
        if code == -WARNING_SIGNAL and shards_run.stopping:
            code = STOPPED  # the warning came as it exited (Python's own handlers gone): its lines are whole
        if code is None or code == STOPPED:
            halted.append(shard if code == STOPPED else -1 - shard)  # negative: never started
        elif code != 0:
            print(f"launch: shard {shard} exited with status {code} (see its log)", file=sys.stderr)
            failed.append(shard)


def main(argv: list[str] | None = None) -> int:
    args, passed = _parse(sys.argv[1:] if argv is None else argv)
    shards_run = Shards()
    signal.signal(WARNING_SIGNAL, shards_run.warn)  # from now on: the warning stops the shards, not this
    num_shards, tp = check_config(args)
    groups = engine_devices(visible_devices(os.environ), tp)
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    if args.serve_index is None:
        if args.retriever_url_file is not None:
            url = wait_for_service(args.retriever_url_file, args.wait_minutes * 60)
            print(f"launch: retrieval service at {url} (from {args.retriever_url_file})", file=sys.stderr)
            passed = [*passed, "--retriever", url]
        return _run_engines(args, passed, groups, num_shards, tp, log_dir, shards_run)
    log = log_dir / log_name("retriever", f"node{args.node_index}", os.environ)
    print(f"launch: starting this node's retrieval service ({args.serve_index}, log {log})", file=sys.stderr)
    with node_service(args.serve_index, log, args.wait_minutes * 60) as url:
        print(f"launch: retrieval service at {url}", file=sys.stderr)
        return _run_engines(args, [*passed, "--retriever", url], groups, num_shards, tp, log_dir, shards_run)


def _run_engines(
    args: LaunchArgs,
    passed: list[str],
    groups: list,
    num_shards: int,
    tp: int,
    log_dir: Path,
    shards_run: Shards,
) -> int:
    """One thread per engine of this node, each sampling its shards in turn; 1 if any shard failed."""
    workers = args.num_nodes * len(groups)
    if workers > num_shards:
        print(f"launch: {workers} engines for {num_shards} shards; some engines stay idle", file=sys.stderr)
    base = [*shlex.split(args.command), "--config", args.config, "--num_shards", str(num_shards)]
    if args.tensor_parallel_size is not None:
        base += ["--tensor_parallel_size", str(tp)]
    failed: list[int] = []
    halted: list[int] = []
    threads = []
    for local, devices in enumerate(groups):
        worker = args.node_index * len(groups) + local
        shards = worker_shards(worker, workers, num_shards)
        env = dict(os.environ)
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        where = ",".join(devices) if devices else "cpu"
        print(f"launch: engine {worker} on {where}: shards {shards} of {num_shards}", file=sys.stderr)
        thread = threading.Thread(
            target=_run_worker, args=(shards_run, [*base, *passed], shards, env, log_dir, failed, halted)
        )
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    if failed:
        print(
            f"launch: shard(s) {sorted(failed)} failed; run the same command again to resume", file=sys.stderr
        )
        return 1
    if halted:
        saved = sorted(s for s in halted if s >= 0)
        waiting = sorted(-1 - s for s in halted if s < 0)
        return stopped(f"shard(s) {saved} saved what they had sampled (not started: {waiting})")
    return 0


if __name__ == "__main__":
    from corag.cli import run_command

    sys.exit(run_command("launch", main, sys.argv[1:]))
