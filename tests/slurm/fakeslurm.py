#!/usr/bin/env python3
"""Slurm stand-ins for one machine: `sbatch`, `srun`, `scontrol` and `scancel` as far as the
project's scripts and tests/slurm/run.sh use them. Jobs run as local processes with the environment Slurm
gives a job: job and array ids, the node list, the submission folder, GPUs as fake device ids. Every
"node" of a job is this machine. State (job ids, pids, exit codes) lives in $FAKE_SLURM_DIR.

    sbatch [--array=0-3] [--nodes=N] [--gpus-per-node=G | --gpus=G] [--output=PATTERN]
           [--time=LIMIT] [--signal=[B:]SIG[@SECONDS]] [--dependency=after|afterok|afterany:ID]
           [--parsable] [--wait] SCRIPT [ARGS]
    srun [--nodes=N] [--ntasks=N] [--output=PATTERN] [--kill-on-bad-exit=1] COMMAND ...
    scontrol show hostnames LIST | scontrol show node NAME | scontrol show job JOBID [-o] | scontrol requeue JOBID
    scancel [--signal=SIG [--batch | --full]] JOBID
    squeue -h -j JOBID -o %T        (the states of the job's tasks that have not ended)
    sinfo -h -e -o '%P %D %c %m %G %l %t'   (one partition of FAKE_SLURM_NODES nodes, default 2: 64 CPUs,
                                           512000 MB, 8 GPUs, no time limit)

As Slurm does: `--time` ends a job at its limit (SIGTERM to every process, SIGKILL after
FAKE_SLURM_KILL_WAIT seconds, default 5; state TIMEOUT); `--signal` sends SIG that many seconds before
the limit (default 60), to the batch shell alone with `B:`, else to the processes of the job's steps
(what srun started); srun forwards the signals it receives to every process of its tasks and returns the
highest exit status of its tasks (128 + N for a task ended by signal N), as srun's man page says; `scontrol
requeue` ends the running job the same way and runs its script again under the same job id, with
SLURM_RESTART_COUNT one higher and its output appended; `scancel --signal` signals the steps, the batch
shell alone (`--batch`) or the batch shell and every process of the job (`--full`). A job id names one
job, `ARRAY_TASK` one array task, and an array's id every task of it. When the script ends, the
processes it left behind are killed, as Slurm kills a job's processes.

Options the stand-ins do not act on (--mem, --requeue, --cpus-per-task, ...) are accepted as sbatch
accepts them; #SBATCH lines in the script are read first, the command line overrides them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ.get("FAKE_SLURM_DIR", "/tmp/fake-slurm"))
NODE_ADDR = "127.0.0.1"
KILL_WAIT_S = float(os.environ.get("FAKE_SLURM_KILL_WAIT", "5"))
FINAL_STATES = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED")


def fail(message: str, code: int = 1) -> None:
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    sys.exit(code)


def split_options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading `--key=value` / `--key value` / `--flag` options, and the rest (the command)."""
    options: dict[str, str] = {}
    takes_value = {
        "-j",
        "--jobs",
        "--array",
        "--nodes",
        "--gpus-per-node",
        "--gpus",
        "--output",
        "-o",
        "--job-name",
        "-J",
        "--mem",
        "--time",
        "--cpus-per-task",
        "--ntasks",
        "--ntasks-per-node",
        "-N",
        "-a",
        "-n",
        "-c",
        "-t",
        "--open-mode",
        "--kill-on-bad-exit",
        "--partition",
        "-p",
        "--signal",
        "--dependency",
        "-d",
    }
    argv = list(argv)
    while argv and argv[0].startswith("-"):
        item = argv.pop(0)
        if item == "--":
            break
        key, eq, value = item.partition("=")
        if not eq and key in takes_value and key not in ("--kill-on-bad-exit",):
            if not argv:
                fail(f"option {key} needs a value", 2)
            value = argv.pop(0)
        elif not eq:
            value = "1"
        options[
            {
                "-N": "--nodes",
                "-a": "--array",
                "-o": "--output",
                "-J": "--job-name",
                "-n": "--ntasks",
                "-t": "--time",
            }.get(key, key)
        ] = value
    return options, argv


def script_options(script: Path) -> dict[str, str]:
    """The #SBATCH lines at the top of a batch script."""
    lines = []
    for line in script.read_text().splitlines()[1:]:
        if line.startswith("#SBATCH"):
            lines += line.split()[1:]
        elif line.strip() and not line.startswith("#"):
            break
    return split_options(lines)[0]


def array_ids(spec: str) -> list[int]:
    """Task ids of an --array spec: 0-3, 0-30:2, 1,3,5 (a %limit is ignored)."""
    ids: list[int] = []
    for part in spec.split("%")[0].split(","):
        span, _, step = part.partition(":")
        lo, dash, hi = span.partition("-")
        ids += list(range(int(lo), int(hi) + 1, int(step or 1))) if dash else [int(lo)]
    return ids


def hostnames(nodelist: str) -> list[str]:
    """node[1-3] -> node1 node2 node3 (the forms this module writes)."""
    m = re.fullmatch(r"(\w+)\[(\d+)-(\d+)\]", nodelist)
    if m:
        return [f"{m[1]}{i}" for i in range(int(m[2]), int(m[3]) + 1)]
    return nodelist.split(",")


def next_job_id() -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    counter = STATE / "last_job_id"
    import fcntl

    with open(STATE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        job_id = int(counter.read_text()) + 1 if counter.exists() else 1000
        counter.write_text(str(job_id))
    return job_id


def record(job_id: int, **fields) -> None:
    path = STATE / f"job-{job_id}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**old, **fields}))
    tmp.replace(path)


def job(job_id: int) -> dict:
    path = STATE / f"job-{job_id}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def job_env(options: dict[str, str], job_id: int, submit_dir: str) -> dict[str, str]:
    nodes = int(options.get("--nodes", "1"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    nodelist = f"node[1-{nodes}]" if nodes > 1 else "node1"
    env.update(
        SLURM_JOB_ID=str(job_id),
        SLURM_JOBID=str(job_id),
        SLURM_NNODES=str(nodes),
        SLURM_JOB_NUM_NODES=str(nodes),
        SLURM_JOB_NODELIST=nodelist,
        SLURM_NODELIST=nodelist,
        SLURM_SUBMIT_DIR=submit_dir,
        SLURMD_NODENAME="node1",
        SLURM_PROCID="0",
        SLURM_JOB_NAME=options.get("--job-name", "job"),
    )
    if "--ntasks" in options or "--ntasks-per-node" in options:  # as sbatch sets it for the job's steps
        env["SLURM_NTASKS"] = options.get("--ntasks") or str(nodes * int(options["--ntasks-per-node"]))
    if "--cpus-per-task" in options:
        env["SLURM_CPUS_PER_TASK"] = options["--cpus-per-task"]
    gpus = options.get("--gpus-per-node") or options.get("--gpus")
    if gpus:
        count = int(gpus.split(":")[-1])
        env.update(
            SLURM_GPUS_ON_NODE=str(count),
            CUDA_VISIBLE_DEVICES=",".join(map(str, range(count))),
            SLURM_JOB_GPUS=",".join(map(str, range(count))),
        )
    return env


def output_path(pattern: str, env: dict[str, str]) -> str:
    array_job = env.get("SLURM_ARRAY_JOB_ID", env["SLURM_JOB_ID"])
    return (
        pattern.replace("%A", array_job)
        .replace("%a", env.get("SLURM_ARRAY_TASK_ID", ""))
        .replace("%j", env["SLURM_JOB_ID"])
        .replace("%x", env["SLURM_JOB_NAME"])
    )


def sbatch(argv: list[str]) -> int:
    options, rest = split_options(argv)
    if not rest:
        fail("no batch script given", 2)
    script = Path(rest[0])
    if not script.is_file():
        fail(f"Unable to open file {script}", 1)
    options = {**script_options(script), **options}
    depends = dependencies(options.get("--dependency"))
    first = next_job_id()
    submit_dir = os.getcwd()
    tasks = array_ids(options["--array"]) if "--array" in options else [None]
    job_ids = [first] + [next_job_id() for _ in tasks[1:]]
    for job_id, task in zip(job_ids, tasks, strict=True):
        env = job_env(options, job_id, submit_dir)
        if task is not None:
            env.update(
                SLURM_ARRAY_JOB_ID=str(first),
                SLURM_ARRAY_TASK_ID=str(task),
                SLURM_ARRAY_TASK_MIN=str(min(tasks)),
                SLURM_ARRAY_TASK_MAX=str(max(tasks)),
                SLURM_ARRAY_TASK_COUNT=str(len(tasks)),
            )
            steps = {b - a for a, b in zip(tasks, tasks[1:], strict=False)}
            env["SLURM_ARRAY_TASK_STEP"] = str(steps.pop() if len(steps) == 1 else 1)
        default_out = "slurm-%A_%a.out" if task is not None else "slurm-%j.out"
        out = output_path(options.get("--output", default_out), env)
        record(
            job_id,
            state="PENDING",
            array=first,
            task=task,
            script=str(script),
            time=options.get("--time"),
            signal=options.get("--signal"),
            options=options,
            depends=depends,
        )
        subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "_run",
                str(job_id),
                out,
                "bash",
                str(script),
                *rest[1:],
            ],
            env=env,
            cwd=submit_dir,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    print(first if "--parsable" in options else f"Submitted batch job {first}", flush=True)
    if "--wait" in options:
        codes = [wait_job(j) for j in job_ids]
        return max(codes)
    return 0


def wait_job(job_id: int) -> int:
    while job(job_id).get("state") not in FINAL_STATES:
        time.sleep(0.5)
    return int(job(job_id).get("exit_code", 1))


def time_limit(spec: str | None) -> float | None:
    """Seconds of an sbatch --time: MIN, MIN:SEC, H:MIN:SEC, D-H, D-H:MIN, D-H:MIN:SEC; None if unlimited."""
    if not spec or spec in ("UNLIMITED", "INFINITE", "-1"):
        return None
    days, dash, rest = spec.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if dash:
        hours, minutes, seconds = [*parts, 0, 0][:3]
    else:
        hours, minutes, seconds = {1: [0, *parts, 0], 2: [0, *parts], 3: parts}[len(parts)]
    return float((((int(days or 0) * 24) + hours) * 60 + minutes) * 60 + seconds)


def signal_spec(spec: str | None) -> tuple[int, float, bool] | None:
    """(signal, seconds before the limit, batch shell only) of an sbatch --signal=[{R|B}:]SIG[@SECONDS]."""
    if not spec:
        return None
    where, colon, rest = spec.partition(":")
    if not colon:
        where, rest = "", spec
    name, _, seconds = rest.partition("@")
    return signal_number(name), float(seconds or 60), "B" in where


def signal_number(name: str) -> int:
    """USR1, SIGUSR1 or 10 as a signal number."""
    if name.isdigit():
        return int(name)
    try:
        return int(signal.Signals["SIG" + name.upper().removeprefix("SIG")])
    except KeyError:
        fail(f"Invalid signal name {name}", 1)
        raise


def children_map() -> dict[int, list[int]]:
    """Every process's children, read from /proc (as proctrack/linuxproc tracks a job's processes)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    """The processes below `pid`, parents first."""
    tree, found, todo = children_map(), [], [pid]
    while todo:
        kids = tree.get(todo.pop(0), [])
        found += kids
        todo += kids
    return found


def send(pids: list[int], sig: int) -> None:
    for pid in pids:
        if pid != os.getpid():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def step_processes(job_id: int) -> list[int]:
    """The processes of the job's steps: every process below each srun still running."""
    pids: list[int] = []
    for srun_pid in job(job_id).get("steps", []):
        if Path(f"/proc/{srun_pid}").exists():
            pids += descendants(srun_pid)
    return pids


DEPENDENCY_TYPES = ("after", "afterok", "afterany")


def dependencies(spec: str | None) -> list[tuple[str, int]]:
    """`after:ID[:ID...][,afterok:ID...]` as (type, job id) pairs; other types are refused as sbatch
    refuses a bad specification."""
    pairs = []
    for part in (spec or "").split(",") if spec else []:
        kind, *ids = part.split(":")
        if kind not in DEPENDENCY_TYPES or not ids or not all(i.isdigit() for i in ids):
            fail(f"Invalid dependency specification {spec!r} (simulated: {', '.join(DEPENDENCY_TYPES)})", 1)
        pairs += [(kind, int(i)) for i in ids]
    return pairs


def wait_dependencies(job_id: int) -> bool:
    """Hold the job PENDING until its dependencies are met, as Slurm does: `after` once the other job
    started (or ended), `afterany` once it ended, `afterok` once it ended in COMPLETED. False when one
    can never be met (an `afterok` job that failed)."""
    for kind, other in job(job_id).get("depends") or []:
        while True:
            state = job(other).get("state")
            if kind == "after" and state not in (None, "PENDING"):
                break
            if state in FINAL_STATES:
                if kind == "afterok" and state != "COMPLETED":
                    return False
                break
            time.sleep(0.5)
    return True


def run_job(job_id: int, out: str, command: list[str]) -> int:
    """The job itself: once its dependencies are met, the script with its output appended to `out`,
    watched for its time limit, its warning signal and requests from scontrol and scancel; run again
    while it is requeued."""
    import ctypes

    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of the job stay below it
    if not wait_dependencies(job_id):
        record(job_id, state="CANCELLED", exit_code=1)  # Slurm: DependencyNeverSatisfied
        return 1
    restarts = 0
    while True:
        env = dict(os.environ)
        if restarts:
            env["SLURM_RESTART_COUNT"] = str(restarts)
        with open(out, "a") as log:
            proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
            record(job_id, state="RUNNING", pid=proc.pid, steps=[], ending=None, restarts=restarts)
            code, state = watch(job_id, proc)
        if state != "REQUEUED":
            code = 0 if state == "COMPLETED" else (code if code > 0 else 1)
            record(job_id, state=state, exit_code=code)
            return code
        restarts += 1


def watch(job_id: int, proc: subprocess.Popen) -> tuple[int, str]:
    """Wait for the batch script; its status and the job's end state (COMPLETED, FAILED, TIMEOUT,
    CANCELLED or REQUEUED). Every process of the job (the script's and the orphans it left) ends with it."""
    meta = job(job_id)
    limit, warning = time_limit(meta.get("time")), signal_spec(meta.get("signal"))
    start, warned, ending, kill_at = time.monotonic(), False, None, None
    while proc.poll() is None:
        reap(proc.pid)
        elapsed = time.monotonic() - start
        if warning and limit is not None and not warned and elapsed >= limit - warning[1]:
            warned = True
            send([proc.pid] if warning[2] else step_processes(job_id), warning[0])
        if ending is None and limit is not None and elapsed >= limit:
            ending = "TIMEOUT"
        ending = ending or job(job_id).get("ending")
        if ending and kill_at is None:
            send(descendants(os.getpid()), signal.SIGTERM)
            kill_at = elapsed + KILL_WAIT_S
        if kill_at is not None and elapsed >= kill_at:
            send(descendants(os.getpid()), signal.SIGKILL)
        time.sleep(0.2)
    leftovers = descendants(os.getpid())
    send(leftovers, signal.SIGKILL)
    for pid in leftovers:
        reap(pid, block=True)
    ending = ending or job(job_id).get("ending")
    return proc.returncode, ending or ("COMPLETED" if proc.returncode == 0 else "FAILED")


def reap(keep: int, block: bool = False) -> None:
    """Collect the orphans that ended below this process (not `keep`, which Popen waits for)."""
    for pid in [keep] if block else children_map().get(os.getpid(), []):
        if pid != keep or block:
            try:
                os.waitpid(pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                pass


# Slurm starts a step's tasks in no set order; the stand-in starts the last task first and the first one
# SRUN_STAGGER_S later, so that a task which takes its peers to be up already fails here every time.
SRUN_STAGGER_S = float(os.environ.get("FAKE_SRUN_STAGGER_S", "5"))


def srun(argv: list[str]) -> int:
    """One process per node (tasks per node: 1), SLURM_PROCID / SLURM_NODEID / SLURMD_NODENAME set;
    the tasks start last first (see SRUN_STAGGER_S)."""
    options, command = split_options(argv)
    if not command:
        fail("no command given", 2)
    nodes = int(options.get("--nodes", os.environ.get("SLURM_NNODES", "1")))
    tasks = int(options.get("--ntasks", str(nodes)))
    names = hostnames(os.environ.get("SLURM_JOB_NODELIST", "node1"))
    if "SLURM_JOB_ID" in os.environ:
        job_id = int(os.environ["SLURM_JOB_ID"])
        record(job_id, steps=[*job(job_id).get("steps", []), os.getpid()])
    children: list[subprocess.Popen] = []

    def forward(sig: int, _frame: object) -> None:  # srun passes a signal on to every process of its tasks
        send([pid for child in children for pid in (child.pid, *descendants(child.pid))], sig)

    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    for rank in reversed(range(tasks)):
        if children:
            time.sleep(SRUN_STAGGER_S)
        env = {
            **os.environ,
            "SLURM_PROCID": str(rank),
            "SLURM_NODEID": str(rank % nodes),
            "SLURMD_NODENAME": names[rank % len(names)],
            "SLURM_LOCALID": "0",
        }
        out = None
        if "--output" in options:
            pattern = output_path(options["--output"], env).replace("%t", str(rank))
            mode = "a" if options.get("--open-mode") == "append" else "w"
            out = open(pattern, mode)
        children.append(
            subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT if out else None)
        )
    kill_on_bad_exit = options.get("--kill-on-bad-exit", "0") == "1"
    codes: dict[int, int] = {}
    while len(codes) < len(children):
        for i, child in enumerate(children):
            if i not in codes and child.poll() is not None:
                codes[i] = child.returncode
                if child.returncode and kill_on_bad_exit:
                    for other in children:
                        if other.poll() is None:
                            other.terminate()
        time.sleep(0.2)
    return max(c if c >= 0 else 128 - c for c in codes.values())


def jobs_named(name: str, running: bool = True) -> list[int]:
    """The job ids a job id names: JOB, ARRAY_TASK, or an array's id (every task of it); those running
    only, unless `running` is False."""
    array, underscore, task = name.partition("_")
    if not array.isdigit() or (underscore and not task.isdigit()):
        fail(f"Invalid job id specified: {name}", 1)
    records = sorted(STATE.glob("job-*.json")) if STATE.exists() else []
    found = []
    for path in records:
        meta = json.loads(path.read_text())
        job_id = int(path.stem.removeprefix("job-"))
        if underscore and meta.get("array") == int(array) and meta.get("task") == int(task):
            found.append(job_id)
        elif not underscore and (
            job_id == int(array) or (meta.get("task") is not None and meta.get("array") == int(array))
        ):
            found.append(job_id)
    if not running:
        return found
    running = [j for j in found if job(j).get("state") == "RUNNING"]
    if not running:
        fail(f"Invalid job id specified or job not running: {name}", 1)
    return running


def scontrol(argv: list[str]) -> int:
    if argv[:2] == ["show", "hostnames"]:
        print("\n".join(hostnames(argv[2] if len(argv) > 2 else os.environ["SLURM_JOB_NODELIST"])))
        return 0
    if argv[:2] == ["show", "node"] and len(argv) > 2:
        print(
            f"NodeName={argv[2]} Arch=x86_64 CoresPerSocket=1\n   NodeAddr={NODE_ADDR} NodeHostName={argv[2]}"
        )
        return 0
    if argv[:2] == ["show", "job"] and len(argv) > 2:
        ids = jobs_named(argv[2], running=False)
        if not ids:
            fail("Invalid job id specified", 1)
        for job_id in ids:
            code = job(job_id).get("exit_code", 0)
            print(f"JobId={job_id} JobState={job(job_id).get('state', 'PENDING')} ExitCode={code}:0")
        return 0
    if argv[:1] == ["requeue"] and len(argv) == 2:
        for job_id in jobs_named(argv[1]):
            if "--requeue" not in job(job_id).get("options", {}) and "--no-requeue" in job(job_id).get(
                "options", {}
            ):
                fail(f"Requested operation is disabled: job {job_id} was submitted with --no-requeue", 1)
            record(job_id, ending="REQUEUED")
        return 0
    fail(f"not simulated: scontrol {' '.join(argv)}", 1)
    return 1


def scancel(argv: list[str]) -> int:
    """scancel JOB (the job ends, CANCELLED), or with --signal: SIG to its steps' processes, to the batch
    shell alone (--batch), or to the batch shell and every process of the job (--full)."""
    options, names = split_options(argv)
    if not names:
        fail("No job identification provided", 1)
    for name in names:
        for job_id in jobs_named(name):
            if "--signal" not in options:
                record(job_id, ending="CANCELLED")
                continue
            sig, batch = signal_number(options["--signal"]), int(job(job_id)["pid"])
            if "--full" in options:
                send([batch, *descendants(batch)], sig)
            else:
                send([batch] if "--batch" in options else step_processes(job_id), sig)
    return 0


def squeue(argv: list[str]) -> int:
    """The states of the job's tasks that have not ended, one a line (`squeue -h -j JOBID -o %T`)."""
    options, _ = split_options(argv)
    name = options.get("-j") or options.get("--jobs")
    if not name:
        fail("give -j JOBID", 2)
    for job_id in jobs_named(name, running=False):
        if job(job_id).get("state") not in FINAL_STATES:
            print(job(job_id).get("state", "PENDING"))
    return 0


def sinfo(argv: list[str]) -> int:
    """One partition of FAKE_SLURM_NODES alike nodes, in the format corag.cluster.submit asks."""
    print(f"debug* {os.environ.get('FAKE_SLURM_NODES', '2')} 64 512000 gpu:8 infinite idle")
    return 0


if __name__ == "__main__":
    name, args = Path(sys.argv[0]).name, sys.argv[1:]
    if name == "fakeslurm.py" and args and args[0] == "_run":
        sys.exit(run_job(int(args[1]), args[2], args[3:]))
    commands = {
        "sbatch": sbatch,
        "srun": srun,
        "scontrol": scontrol,
        "scancel": scancel,
        "squeue": squeue,
        "sinfo": sinfo,
    }
    if name not in commands:
        fail(f"run as one of {', '.join(commands)} (a link named so)", 2)
    sys.exit(commands[name](args))
