"""The node runner: what every launch script (corag/cluster/scripts/) execs under its batch shell.

    python -m corag.cluster.node sample CONFIG [--node-index I --num-nodes N] [--num-shards S]
        [--tensor-parallel-size T] [--serve-index INDEX | --retriever-url-file FILE] [--wait-minutes M]
        [--log-dir logs] [-- flags for corag sample]
    python -m corag.cluster.node evaluate CONFIG --data FILE [--data FILE ...] [--serve-index INDEX |
        --retriever-url-file FILE] [--out-root runs/eval] [--gpus-per-run G] [--wait-minutes M]
        [-- flags for corag evaluate]
    python -m corag.cluster.node train sft|grpo zero3|fsdp|ddp|ACCELERATE_YAML CONFIG [--serve-index INDEX]
        [recipe flags]
    python -m corag.cluster.node serve INDEX URL_FILE [--remote] [--port P] [--wait-minutes M] [--log FILE]
        [-- flags for corag serve-retriever]
    python -m corag.cluster.node pool SAMPLING_CONFIG ... (python -m corag.cluster.pool's arguments)

One rule says which GPUs a node has (`visible_devices`): CUDA_VISIBLE_DEVICES as Slurm (or the user) set
it, else SLURM_STEP_GPUS / SLURM_JOB_GPUS (renumbered from 0 where the job's cgroup shows only its own
GPUs), else every GPU `nvidia-smi` lists; none runs one engine (or one training process) on the CPU. One
path starts this node's retrieval service (`node_service`: a child `corag serve-retriever` on loopback,
waited for until it answers, stopped when the node's work ends, its log in the log folder). At start the
runner logs the CPUs this process may use (os.sched_getaffinity; every process it starts inherits them)
and warns in one line when they are fewer than the job asked (SLURM_CPUS_PER_TASK); every srun it runs
passes the job's CPUs per task (srun takes none from the job since Slurm 22.05).

- sample: the shards of a sampling run on this node. The run's shards are fixed by the config
  (`num_shards`), never by the hardware: node I of N runs engines of `tensor_parallel_size` devices each,
  and engine e of the W = N x engines workers samples shards e, e + W, ... one after another. In an array
  task, I and N come from the array (task i of the array is node i of the run).
- evaluate: every questions file (and method of the config) split into as many parts as the job has
  engines; one task per node (srun) starts the node's service and its engines, each answering its part of
  every file in turn; once every part finished, each file's parts are merged and one table is written.
- train: one task per node (srun), each running `accelerate launch` over its node's GPUs (one process a
  GPU, or CORAG_PROCS_PER_NODE), all joining one world by c10d rendezvous at the job's first node, whose
  store this process hosts until every node has ended (python -m corag.cluster.accelerate_join).
- serve: a retrieval service for other nodes (or this job's): its URL written to URL_FILE once it answers.

The warning before the time limit (SIGUSR1, passed on by the batch shell, python -m corag.cluster.requeue)
stops the work after the unit in hand (exit status 75, corag.cluster.stop); the batch shell requeues.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from corag.cluster.stop import STOPPED, WARNING_SIGNAL, job_tag, stopped
from corag.config import load_yaml, parse_config
from corag.data.jsonl import atomic_write
from corag.errors import InputError
from corag.resources import CONFIGS
from corag.retrieval.client import answers_health, wait_for_service

STAGES = ("sample", "evaluate", "train", "serve", "pool")
RECIPES = ("sft", "grpo")


def say(message: str) -> None:
    print(f"node: {message}", file=sys.stderr, flush=True)


# Devices and CPUs ------------------------------------------------------------------------------------


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


def engine_devices(devices: list[str] | None, per_engine: int, what: str = "tensor_parallel_size") -> list:
    """The devices of each engine on this node: consecutive groups of `per_engine`; [None] without GPUs."""
    if per_engine < 1:
        raise InputError(f"must be at least 1, got {per_engine}", field=what)
    if devices is None:
        return [None]
    if len(devices) < per_engine:
        raise InputError(
            f"this node has {len(devices)} GPU(s) ({','.join(devices)}), an engine needs {per_engine}",
            field=what,
        )
    engines = len(devices) // per_engine
    if engines * per_engine < len(devices):
        say(f"GPU(s) {','.join(devices[engines * per_engine :])} left unused ({what} {per_engine})")
    return [devices[e * per_engine : (e + 1) * per_engine] for e in range(engines)]


def cpu_ranges(cpus: Sequence[int]) -> str:
    """`0-3,8`: CPU ids as ranges."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def log_cpus(env: Mapping[str, str], usable: set[int] | None = None) -> int:
    """One line: the CPUs this process (and all it starts) may use, and what the job asked a task; a
    second, warning, line when they are fewer. Returns how many are usable."""
    usable = os.sched_getaffinity(0) if usable is None else usable
    asked = env.get("SLURM_CPUS_PER_TASK", "")
    host = env.get("SLURMD_NODENAME") or socket.gethostname()
    said = f"; the job asked {asked} a task" if asked else ""
    say(f"{len(usable)} CPU(s) usable on {host} ({cpu_ranges(sorted(usable))}){said}")
    if asked.isdigit() and len(usable) < int(asked):
        say(
            f"warning: {len(usable)} CPU(s) usable here, fewer than the {asked} the job asked (--cpus-per-task)"
        )
    return len(usable)


def srun(env: Mapping[str, str], nodes: int, *options: str) -> list[str]:
    """srun with one task per node, passing the job's CPUs per task (srun takes none from the job)."""
    cpus = [f"--cpus-per-task={env['SLURM_CPUS_PER_TASK']}"] if env.get("SLURM_CPUS_PER_TASK") else []
    return ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", *cpus, *options]


def log_name(stem: str, what: str, env: Mapping[str, str]) -> str:
    """`stem-<job>-what.log`, the job as corag.cluster.stop.job_tag names it; `stem-what.log` outside Slurm."""
    tag = job_tag(env)
    return f"{stem}-{tag}-{what}.log" if tag else f"{stem}-{what}.log"


# This node's retrieval service -----------------------------------------------------------------------


def free_port() -> int:
    """A TCP port no one listens on now (the OS's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def node_service(
    index: str,
    log: str | Path | None = None,
    wait_seconds: float = 1800.0,
    remote: bool = False,
    port: int | None = None,
    flags: Sequence[str] = (),
) -> Iterator[str]:
    """`corag serve-retriever INDEX` in a child process for the duration of the block; yields its URL
    once it answers /health. A service that exits first, or answers nothing within `wait_seconds`, is an
    InputError naming the index and the log."""
    port = port or (8000 if remote else free_port())
    host = ["--host", "0.0.0.0", "--allow-remote"] if remote else ["--host", "127.0.0.1"]
    name = os.environ.get("CORAG_SERVICE_HOST") or socket.gethostname()  # how other nodes reach this one
    url = f"http://{name if remote else '127.0.0.1'}:{port}"
    command = [
        sys.executable,
        "-m",
        "corag.cli",
        "serve-retriever",
        index,
        *host,
        "--port",
        str(port),
        *flags,
    ]
    out = open(log, "ab") if log else None  # noqa: SIM115 (held by the child for the block)
    service = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT if out else None)
    seen = f" (see {log})" if log else ""
    try:
        deadline = time.monotonic() + wait_seconds
        while not answers_health(f"http://127.0.0.1:{port}"):
            if service.poll() is not None:
                raise InputError(
                    f"the retrieval service exited with status {service.returncode} before answering{seen}",
                    file=index,
                )
            if time.monotonic() > deadline:
                raise InputError(
                    f"the retrieval service did not answer within {wait_seconds / 60:g} min{seen}", file=index
                )
            time.sleep(0.5)
        yield url
    finally:
        if service.poll() is None:
            service.terminate()
            try:
                service.wait(timeout=60)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait()
        if out:
            out.close()


@contextmanager
def retrieval(serve_index: str | None, url_file: str | None, wait_minutes: float, log_dir: Path, node: int):
    """The `--retriever URL` flags of this node's work: its own service over `serve_index` (started,
    waited for, stopped after the block), a service job's URL file waited for, or none."""
    if serve_index and url_file:
        raise InputError("give --serve-index or --retriever-url-file, not both", field="--serve-index")
    if url_file:
        url = wait_for_service(url_file, wait_minutes * 60)
        say(f"retrieval service at {url} (from {url_file})")
        yield ["--retriever", url]
        return
    if not serve_index:
        yield []
        return
    log = log_dir / log_name("retriever", f"node{node}", os.environ)
    say(f"starting this node's retrieval service ({serve_index}, log {log})")
    with node_service(serve_index, log, wait_minutes * 60) as url:
        say(f"node {node} searches {url}: retrieval service at {url}")
        yield ["--retriever", url]


# Child processes and the warning ---------------------------------------------------------------------


class Children:
    """The processes this runner started, and whether the warning signal asked them to stop."""

    def __init__(self) -> None:
        self.running: list[subprocess.Popen] = []
        self.stopping = False
        self.lock = threading.Lock()

    def warn(self, signum: int, frame: object) -> None:
        """The warning signal: pass it on to every running child; start no other."""
        with self.lock:
            self.stopping = True
            for proc in self.running:
                if proc.poll() is None:
                    proc.send_signal(signum)

    def start(
        self, command: list[str], env: Mapping[str, str] | None = None, log: Path | None = None
    ) -> subprocess.Popen | None:
        """A child started, or None when the warning came first."""
        with self.lock:
            if self.stopping:
                return None
            out = open(log, "ab") if log else None  # noqa: SIM115 (closed once the child holds it)
            proc = subprocess.Popen(
                command,
                env=None if env is None else dict(env),
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
            )
            if out:
                out.close()  # the child has its own copy
            self.running.append(proc)
            return proc

    def status(self, proc: subprocess.Popen) -> int:
        """A child's exit status once it ended; 75 when the warning reached it as it exited."""
        code = proc.wait()
        if code in (-WARNING_SIGNAL, 128 + WARNING_SIGNAL) and self.stopping:
            code = STOPPED  # the warning came as it exited (its own handlers gone): its lines are whole
        return code

    def run(
        self, command: list[str], env: Mapping[str, str] | None = None, log: Path | None = None
    ) -> int | None:
        """A child's exit status (see `status`), or None when it was not started (the warning came first)."""
        proc = self.start(command, env, log)
        return None if proc is None else self.status(proc)


# sample ------------------------------------------------------------------------------------------------


def _split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The runner's own arguments and the flags after `--` (passed to every child)."""
    argv = list(argv)
    if "--" in argv:
        return argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    return argv, []


@dataclass
class SampleArgs:
    config: str = field(
        metadata={"positional": True, "help": "sampling config (YAML); its num_shards names the run's shards"}
    )
    node_index: int | None = field(
        default=None, metadata={"help": "this node's index (default: the array's)"}
    )
    num_nodes: int | None = field(default=None, metadata={"help": "nodes of the run (default: the array's)"})
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
    log_dir: str = field(
        default_factory=lambda: os.environ.get("CORAG_LOG_DIR", "logs"),
        metadata={"help": "one log file per shard (default: $CORAG_LOG_DIR, else logs)"},
    )
    command: str = field(
        default_factory=lambda: os.environ.get(
            "CORAG_LAUNCH_COMMAND", f"{shlex.quote(sys.executable)} -m corag.cli sample"
        ),
        metadata={"help": "the program each shard runs (default: $CORAG_LAUNCH_COMMAND, else this Python's "
        "`corag sample`)"},
    )  # fmt: skip


def array_node(env: Mapping[str, str]) -> tuple[int, int] | None:
    """(this task's node index, the array's task count) in an array job (any range: 16-31, 0-30:2)."""
    if "SLURM_ARRAY_TASK_ID" not in env:
        return None
    task = int(env["SLURM_ARRAY_TASK_ID"])
    first = int(env.get("SLURM_ARRAY_TASK_MIN", task))
    step = int(env.get("SLURM_ARRAY_TASK_STEP", 1))
    count = env.get("SLURM_ARRAY_TASK_COUNT")
    total = int(count) if count else (int(env.get("SLURM_ARRAY_TASK_MAX", task)) - first) // step + 1
    return (task - first) // step, total


def _setting(config: str, given: int | None, values: dict, name: str, default: int | None) -> int:
    value = given if given is not None else values.get(name, default)
    if value is None:
        raise InputError(
            f"set {name} in the config (or --{name.replace('_', '-')}): shard names must not depend on "
            "how many GPUs a node has",
            file=config,
            field=name,
        )
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(f"must be a positive integer, got {value!r}", file=config, field=name)
    return value


def check_config(args: SampleArgs) -> tuple[int, int]:
    """The config's num_shards and tensor_parallel_size as the runner takes them, or an InputError."""
    values = load_yaml(args.config)
    num_shards = _setting(args.config, args.num_shards, values, "num_shards", None)
    return num_shards, _setting(args.config, args.tensor_parallel_size, values, "tensor_parallel_size", 1)


def worker_shards(worker: int, workers: int, num_shards: int) -> list[int]:
    """The shards one engine of the run samples, in order."""
    return list(range(worker, num_shards, workers))


def sample(argv: Sequence[str]) -> int:
    """`--array` first (sampling/slurm_array.sh): task i of the Slurm array is node i of the run."""
    in_array = list(argv[:1]) == ["--array"]
    own, passed = _split(argv[1:] if in_array else argv)
    args = parse_config(SampleArgs, own, "python -m corag.cluster.node sample")
    children = Children()
    signal.signal(WARNING_SIGNAL, children.warn)  # from now on: the warning stops the shards, not this
    array = array_node(os.environ) if in_array else None
    if in_array and array is None:
        raise InputError("not an array task (no SLURM_ARRAY_TASK_ID): submit it with sbatch --array=A-B")
    node = args.node_index if args.node_index is not None else (array[0] if array else 0)
    nodes = args.num_nodes if args.num_nodes is not None else (array[1] if array else 1)
    if not 0 <= node < nodes:
        raise InputError(f"need 0 <= node index < --num-nodes, got {node} and {nodes}", field="--node-index")
    num_shards, tp = check_config(args)
    groups = engine_devices(visible_devices(os.environ), tp)
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_cpus(os.environ)
    with retrieval(args.serve_index, args.retriever_url_file, args.wait_minutes, log_dir, node) as found:
        workers = nodes * len(groups)
        if workers > num_shards:
            say(f"{workers} engines for {num_shards} shards; some engines stay idle")
        base = [*shlex.split(args.command), "--config", args.config, "--num_shards", str(num_shards)]
        if args.tensor_parallel_size is not None:
            base += ["--tensor_parallel_size", str(tp)]
        failed: list[int] = []
        halted: list[int] = []

        def engine(shards: list[int], env: dict[str, str]) -> None:
            for shard in shards:
                log = log_dir / log_name("sample", f"shard-{shard:05d}", env)
                code = children.run([*base, *passed, *found, "--shard", str(shard)], env, log)
                if code is None or code == STOPPED:
                    halted.append(shard if code == STOPPED else -1 - shard)  # negative: never started
                elif code != 0:
                    say(f"shard {shard} exited with status {code} (see its log)")
                    failed.append(shard)

        threads = []
        for local, devices in enumerate(groups):
            worker = node * len(groups) + local
            shards = worker_shards(worker, workers, num_shards)
            env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ",".join(devices)} if devices else {})}
            say(
                f"engine {worker} on {','.join(devices) if devices else 'cpu'}: shards {shards} of {num_shards}"
            )
            threads.append(threading.Thread(target=engine, args=(shards, env)))
            threads[-1].start()
        for thread in threads:
            thread.join()
    if failed:
        say(f"shard(s) {sorted(failed)} failed; run the same command again to resume")
        return 1
    if halted:
        saved = sorted(s for s in halted if s >= 0)
        waiting = sorted(-1 - s for s in halted if s < 0)
        return stopped(f"shard(s) {saved} saved what they had sampled (not started: {waiting})")
    return 0


# evaluate ----------------------------------------------------------------------------------------------


@dataclass
class EvaluateArgs:
    """The evaluation stage's own options; `--data FILE` (once a file) is read before them."""

    config: str = field(metadata={"positional": True, "help": "evaluation config (YAML)"})
    serve_index: str | None = field(
        default=None, metadata={"help": "start each node's retrieval service over this index"}
    )
    retriever_url_file: str | None = field(
        default=None, metadata={"help": "wait for the URL file a retrieval service job writes"}
    )
    wait_minutes: float = field(default=30.0, metadata={"help": "how long to wait for the service"})
    out_root: str = field(
        default="runs/eval", metadata={"help": "one folder a questions file, and results.md"}
    )
    gpus_per_run: int = field(default=1, metadata={"help": "GPUs of one engine"})
    command: str = field(
        default_factory=lambda: os.environ.get(
            "CORAG_EVAL_COMMAND", f"{shlex.quote(sys.executable)} -m corag.cli evaluate"
        ),
        metadata={"help": "the program each part runs (default: $CORAG_EVAL_COMMAND, else corag evaluate)"},
    )
    log_dir: str = field(
        default_factory=lambda: os.environ.get("CORAG_LOG_DIR", "logs"), metadata={"help": "logs"}
    )
    on_node: str | None = field(
        default=None, metadata={"help": "set by the job for its srun tasks: PARTS_PER_NODE,PARTS"}
    )


def evaluate(argv: Sequence[str]) -> int:
    own, passed = _split(argv)
    rest, data = [], []  # --data FILE, once a file
    while own:
        word = own.pop(0)
        if word == "--data" and own:
            data.append(own.pop(0))
        elif word.startswith("--data="):
            data.append(word.split("=", 1)[1])
        else:
            rest.append(word)
    args = parse_config(EvaluateArgs, rest, "python -m corag.cluster.node evaluate")
    if not data:
        raise InputError("give at least one --data FILE", field="--data")
    if args.gpus_per_run < 1:
        raise InputError(f"must be 1 or more, got {args.gpus_per_run}", field="--gpus-per-run")
    if args.serve_index and args.retriever_url_file:
        raise InputError("give --serve-index or --retriever-url-file, not both", field="--serve-index")
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    job = os.environ.get("SLURM_JOB_ID") or str(os.getpid())
    failed_mark = log_dir / f"failed-{job}"
    if args.on_node:
        per_node, parts = (int(n) for n in args.on_node.split(","))
        return evaluate_node(args, data, passed, per_node, parts, failed_mark)
    nodes = int(os.environ.get("SLURM_NNODES", "1"))
    devices = visible_devices(os.environ)
    per_node = max(1, len(devices or []) // args.gpus_per_run)
    parts = nodes * per_node
    say(f"{len(data)} file(s), each in {parts} part(s): {nodes} node(s) x {per_node} engine(s) of "
        f"{args.gpus_per_run} GPU(s) (cpu without GPUs)")  # fmt: skip
    failed_mark.unlink(missing_ok=True)
    if "SLURM_JOB_ID" in os.environ:
        node_args = [*rest, *(w for f in data for w in ("--data", f)), "--on-node", f"{per_node},{parts}"]
        node_args += ["--", *passed]
        command = [
            *srun(os.environ, nodes),
            sys.executable,
            "-m",
            "corag.cluster.node",
            "evaluate",
            *node_args,
        ]
        children = Children()
        signal.signal(WARNING_SIGNAL, children.warn)  # srun passes it on to every process of the nodes
        status = children.run(command)
        status = STOPPED if status is None else status
    else:
        status = evaluate_node(args, data, passed, per_node, parts, failed_mark)
    if failed_mark.exists():  # a node failed, whatever the others did (srun reports the highest status)
        failed_mark.unlink()
        status = status if status not in (0, STOPPED) else 1
    logs = log_dir / f"corag-eval-{job}-*-part*.log"
    if status == STOPPED:
        say(
            f"a part stopped on the warning before the time limit (see {logs}); no file merged, the rerun resumes"
        )
        return STOPPED
    if status != 0:
        say(f"a part failed (see {logs}); resubmit to resume")
        return status
    command = shlex.split(args.command)
    for file in data:
        out = Path(args.out_root) / Path(file).name.removesuffix(".jsonl")
        if parts > 1:
            merge = [*command, "--config", args.config, "--data", file, "--out-dir", str(out)]
            subprocess.run(
                [*merge, "--num-shards", str(parts), "--merge", *passed],
                check=True,
                stdout=subprocess.DEVNULL,
            )
    subprocess.run([sys.executable, "-m", "corag.cli", "results", args.out_root], check=True)
    say(f"results in {args.out_root}/ (one table: {args.out_root}/results.md)")
    return 0


def evaluate_node(
    args: EvaluateArgs, data: list[str], passed: list[str], per_node: int, parts: int, failed_mark: Path
) -> int:
    """This node's parts of every file, `per_node` engines at once; 1 if a part failed (and the job's
    failure mark written), else 75 if one stopped on the warning."""
    signal.signal(WARNING_SIGNAL, signal.SIG_IGN)  # srun sends it to every process: only the parts act on it
    node = int(os.environ.get("SLURM_PROCID", "0"))
    job = os.environ.get("SLURM_JOB_ID") or str(os.getpid())
    log_dir = Path(args.log_dir)
    log_cpus(os.environ)
    try:
        devices = visible_devices(os.environ)
        if devices is not None and len(devices) < per_node * args.gpus_per_run:
            raise InputError(
                f"node {node} has {len(devices)} GPU(s), the first node {per_node * args.gpus_per_run}: give every "
                "node as many (--gpus-per-node)"
            )
        slots = engine_devices(devices, args.gpus_per_run, "--gpus-per-run")[:per_node] if devices else [None]
        children, failed, halted = Children(), [], []
        with retrieval(args.serve_index, args.retriever_url_file, args.wait_minutes, log_dir, node) as found:

            def engine(part: int, devs: list[str] | None) -> None:
                for file in data:
                    name = Path(file).name.removesuffix(".jsonl")
                    log = log_dir / f"corag-eval-{job}-{name}-part{part}.log"
                    say(
                        f"part {part} of {parts} of {file} on {','.join(devs) if devs else 'cpu'} (node {node}), log {log}"
                    )
                    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ",".join(devs)} if devs else {})}
                    command = [*shlex.split(args.command), "--config", args.config, "--data", file]
                    command += ["--out-dir", str(Path(args.out_root) / name), "--shard", str(part)]
                    code = children.run([*command, "--num-shards", str(parts), *found, *passed], env, log)
                    if code in (STOPPED, 128 + WARNING_SIGNAL, -WARNING_SIGNAL):
                        say(f"part {part} of {file} stopped on the warning before the time limit (see {log})")
                        halted.append(part)
                        return
                    if code != 0:
                        say(f"part {part} of {file} failed (see {log})")
                        failed.append(part)

            threads = [
                threading.Thread(target=engine, args=(node * per_node + slot, devs))
                for slot, devs in enumerate(slots)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    except InputError as error:
        say(f"error: {' '.join(str(error).split())}")
        failed_mark.touch()
        return 2
    if failed:
        failed_mark.touch()
        return 1
    return STOPPED if halted else 0


# train -------------------------------------------------------------------------------------------------


def procs_per_node(env: Mapping[str, str]) -> int:
    """Training processes a node: CORAG_PROCS_PER_NODE, else one a GPU of this node."""
    if env.get("CORAG_PROCS_PER_NODE"):
        return int(env["CORAG_PROCS_PER_NODE"])
    devices = visible_devices(env)
    if not devices:
        raise InputError("no GPUs in this job (ask for --gpus-per-node, or set CORAG_PROCS_PER_NODE)")
    return len(devices)


def head_address(env: Mapping[str, str]) -> str:
    """The job's first node as other nodes reach it (Slurm's NodeAddr; its name where Slurm gives none)."""
    names = subprocess.run(
        ["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    shown = subprocess.run(["scontrol", "show", "node", names[0]], capture_output=True, text=True).stdout
    addr = next((w.split("=", 1)[1] for w in shown.split() if w.startswith("NodeAddr=")), "")
    return addr or names[0]


def train(argv: Sequence[str]) -> int:
    usage = "train sft|grpo zero3|fsdp|ddp|ACCELERATE_YAML CONFIG [--serve-index INDEX] [recipe flags]"
    argv = list(argv)
    on_node = argv[:1] == ["--on-node"]
    if on_node:
        argv = argv[1:]
    if len(argv) < 3:
        raise InputError(f"usage: python -m corag.cluster.node {usage}")
    recipe, accel, config, rest = argv[0], argv[1], argv[2], argv[3:]
    if recipe not in RECIPES:
        raise InputError(f"the recipe is sft or grpo, not {recipe!r} ({usage})", field="recipe")
    accel = accel if accel.endswith(".yaml") else str(CONFIGS / "accelerate" / f"{accel}.yaml")
    serve_index, recipe_args = None, []
    while rest:
        word = rest.pop(0)
        if word == "--serve-index" and rest:
            serve_index = rest.pop(0)
        else:
            recipe_args.append(word)
    if serve_index and recipe != "grpo":
        raise InputError("--serve-index is for grpo (SFT searches nothing)", field="--serve-index")
    for path, what in ((accel, "accelerate config"), (config, f"{recipe} config")):
        if not Path(path).is_file():
            raise InputError(f"no {what} here", file=path)
    if serve_index and not Path(serve_index).is_dir():
        raise InputError("no index folder", file=serve_index)
    if "SLURM_NNODES" not in os.environ:
        raise InputError(
            "not in a Slurm job (no SLURM_NNODES): submit it with sbatch --nodes=N recipes/slurm_train.sh ..."
        )
    nodes = int(os.environ["SLURM_NNODES"])
    log_dir = Path(os.environ.get("CORAG_LOG_DIR", "logs"))
    log_dir.mkdir(parents=True, exist_ok=True)
    if on_node:
        return train_node(recipe, accel, config, serve_index, recipe_args, log_dir)
    per_node = procs_per_node(os.environ)
    head = head_address(os.environ)
    port = int(os.environ.get("MAIN_PORT") or 29500 + int(os.environ.get("SLURM_JOB_ID", "0")) % 1000)
    say(
        f"{recipe} on {nodes} node(s) x {per_node} process(es), rendezvous at {head}:{port}, logs in {log_dir}/"
    )
    os.environ.update(CORAG_TRAIN_HEAD=f"{head}:{port}", CORAG_TRAIN_PROCS=str(nodes * per_node))
    output = f"--output={log_dir}/corag-{recipe}-%j-node%t.log"
    node_args = ["--on-node", recipe, accel, config, *(["--serve-index", serve_index] if serve_index else [])]
    command = [*srun(os.environ, nodes, "--kill-on-bad-exit=1", "--open-mode=append", output)]
    command += [sys.executable, "-m", "corag.cluster.node", "train", *node_args, *recipe_args]
    children = Children()
    signal.signal(WARNING_SIGNAL, children.warn)  # srun passes it on to every process of the nodes
    # Over several nodes the rendezvous store lives here, on the first node, until every node has ended,
    # and every node only connects to it (is_host=0): hosted by the first node's launcher, it would end
    # with that launcher, and a node leaving a moment later would fail its rendezvous heartbeat and shutdown.
    job = os.environ.get("SLURM_JOB_ID", "0")
    for mark in log_dir.glob(f"ended-{job}-node*"):  # left by an earlier run of this (requeued) job
        mark.unlink()
    with rendezvous_store(port) if nodes > 1 else nullcontext():
        srun_proc = children.start(command)
        if srun_proc is None:
            return STOPPED
        return watch_nodes(children, srun_proc, log_dir, job, nodes)


def watch_nodes(children: Children, proc: subprocess.Popen, log_dir: Path, job: str, nodes: int) -> int:
    """srun's status; but once a node has ended training, a node still running CORAG_EXIT_WATCHDOG_SECONDS
    (default 300) later is a process left alive at exit (a teardown deadlock): the step is ended, with a
    line saying so, and the job's status is that of the nodes that ended."""
    grace = float(os.environ.get("CORAG_EXIT_WATCHDOG_SECONDS", "300"))
    first_end = None
    while proc.poll() is None:
        marks = log_dir.glob(f"ended-{job}-node*")
        ended = {int(m.name.rsplit("node", 1)[1]): m.read_text().strip() for m in marks}
        if ended and first_end is None:
            first_end = time.monotonic()
        if first_end is not None and time.monotonic() - first_end > grace:
            alive = sorted(set(range(nodes)) - set(ended))
            say(
                f"watchdog: node(s) {alive} still running {grace:g} s after node(s) {sorted(ended)} ended "
                "training: ending them (a process left alive at exit)"
            )
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            codes = {int(code) for code in ended.values() if code.lstrip("-").isdigit()}
            return max(codes, default=1)
        time.sleep(1)
    return children.status(proc)


@contextmanager
def rendezvous_store(port: int) -> Iterator[None]:
    """A c10d TCPStore on every interface of this node for the duration of the block."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False, timeout=timedelta(hours=1))
    try:
        yield
    finally:
        del store


def train_node(
    recipe: str, accel: str, config: str, serve_index: str | None, recipe_args: list[str], log_dir: Path
) -> int:
    """This node's `accelerate launch` (joining the first node's store), beside its retrieval service."""
    signal.signal(WARNING_SIGNAL, signal.SIG_IGN)  # srun sends it to every process: only the trainers act
    node = int(os.environ.get("SLURM_PROCID", "0"))
    nodes = int(os.environ["SLURM_NNODES"])
    head, _, port = os.environ["CORAG_TRAIN_HEAD"].rpartition(":")
    log_cpus(os.environ)
    accelerate = os.environ.get("ACCELERATE", "accelerate")
    launch = (
        [accelerate] if nodes == 1 else [sys.executable, "-m", "corag.cluster.accelerate_join", accelerate]
    )
    launch += ["launch", "--config_file", accel, "--num_machines", str(nodes)]
    launch += ["--num_processes", os.environ["CORAG_TRAIN_PROCS"], "--machine_rank", str(node)]
    launch += ["--main_process_ip", head, "--main_process_port", port, "--rdzv_backend", "c10d"]
    launch += [
        "--rdzv_conf",
        f"is_host={int(nodes == 1)}",
        "-m",
        f"corag.recipes.{recipe}",
        "--config",
        config,
    ]
    wait = float(os.environ.get("CORAG_SERVICE_WAIT_MINUTES", "30"))
    with retrieval(serve_index, None, wait, log_dir, node) as found:
        code = subprocess.run([*launch, *recipe_args, *found]).returncode
    # the job's watchdog reads these: a node that has ended while another still runs
    (log_dir / f"ended-{os.environ.get('SLURM_JOB_ID', '0')}-node{node}").write_text(f"{code}\n")
    return code


# serve and pool ----------------------------------------------------------------------------------------


@dataclass
class ServeArgs:
    index: str = field(metadata={"positional": True, "help": "index folder written by `corag index`"})
    url_file: str = field(metadata={"positional": True, "help": "where the service's URL is written"})
    remote: bool = field(
        default=False, metadata={"help": "serve other nodes: every interface, the URL under this host's name"}
    )
    port: int | None = field(default=None, metadata={"help": "default: a free port (8000 with --remote)"})
    wait_minutes: float = field(default=30.0, metadata={"help": "how long the index may take to load"})
    log: str | None = field(default=None, metadata={"help": "the service's log (default: this output)"})


def serve(argv: Sequence[str]) -> int:
    """The runner's own flags, INDEX and URL_FILE, then `corag serve-retriever`'s flags (after an
    optional `--`)."""
    own, rest = [], list(argv)
    while rest and rest[0].startswith("--") and rest[0] != "--":
        own.append(rest.pop(0))
        if own[-1] == "--remote":
            own.append("true")
        elif own[-1] in ("--port", "--wait-minutes", "--log") and rest:
            own.append(rest.pop(0))
    own, rest = [*own, *rest[:2]], rest[2:]
    flags = rest[1:] if rest[:1] == ["--"] else rest
    args = parse_config(ServeArgs, own, "python -m corag.cluster.node serve")
    if args.port is None and os.environ.get("PORT"):
        args.port = int(os.environ["PORT"])
    url_file = Path(args.url_file)
    # scancel and `kill` send SIGTERM: leave through the finally blocks (service stopped, file removed)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    log_cpus(os.environ)
    port = args.port or (8000 if args.remote else free_port())
    with node_service(args.index, args.log, args.wait_minutes * 60, args.remote, port, flags) as url:
        try:
            with atomic_write(url_file) as f:
                f.write(url + "\n")
            print(f"retrieval service of {args.index} at {url} (written to {url_file})", flush=True)
            while answers_health(f"http://127.0.0.1:{port}", timeout=30):
                time.sleep(10)
            say(f"the retrieval service at {url} stopped answering")
            return 1
        finally:
            url_file.unlink(missing_ok=True)


def pool(argv: Sequence[str]) -> int:
    from corag.cluster.pool import main as pool_main

    log_cpus(os.environ)
    return pool_main(list(argv))


RUNNERS = {"sample": sample, "evaluate": evaluate, "train": train, "serve": serve, "pool": pool}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if argv[0] not in RUNNERS:
        raise InputError(f"no stage {argv[0]!r}: the node runner runs {', '.join(STAGES)}", field="stage")
    if os.environ.get("SLURM_SUBMIT_DIR"):
        os.chdir(os.environ["SLURM_SUBMIT_DIR"])  # paths are relative to where the job was submitted
    return RUNNERS[argv[0]](argv[1:])


if __name__ == "__main__":
    from corag.cli import run_command

    sys.exit(run_command("node", main, sys.argv[1:]))
