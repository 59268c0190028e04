#!/usr/bin/env python3
"""Slurm stand-ins for one machine: `sbatch`, `srun` and `scontrol` as far as the
project's scripts and tests/slurm/run.sh use them. Jobs run as local processes with the environment Slurm
gives a job: job and array ids, the node list, the submission folder, GPUs as fake device ids. Every
"node" of a job is this machine. State (job ids, pids, exit codes) lives in $FAKE_SLURM_DIR.

    sbatch [--array=0-3] [--nodes=N] [--gpus-per-node=G | --gpus=G]
           [--output=PATTERN] [--wait] SCRIPT [ARGS]
    srun [--nodes=N] [--ntasks=N] [--output=PATTERN] [--kill-on-bad-exit=1] COMMAND ...
    scontrol show hostnames LIST | scontrol show node NAME

Options the stand-ins do not act on (--mem, --time, --requeue, --cpus-per-task, ...) are accepted as
sbatch accepts them; #SBATCH lines in the script are read first, the command line overrides them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ.get("FAKE_SLURM_DIR", "/tmp/fake-slurm"))
NODE_ADDR = "127.0.0.1"


def fail(message: str, code: int = 1) -> None:
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    sys.exit(code)


def split_options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading `--key=value` / `--key value` / `--flag` options, and the rest (the command)."""
    options: dict[str, str] = {}
    takes_value = {
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
            {"-N": "--nodes", "-a": "--array", "-o": "--output", "-J": "--job-name", "-n": "--ntasks"}.get(
                key, key
            )
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
    if "--dependency" in options:
        fail("--dependency is not simulated (run.sh waits for each job with --wait)", 2)
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
        record(job_id, state="PENDING", array=first, script=str(script))
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
    print(f"Submitted batch job {first}", flush=True)
    if "--wait" in options:
        codes = [wait_job(j) for j in job_ids]
        return max(codes)
    return 0


def wait_job(job_id: int) -> int:
    while job(job_id).get("state") not in ("COMPLETED", "FAILED"):
        time.sleep(0.5)
    return int(job(job_id).get("exit_code", 1))


def run_job(job_id: int, out: str, command: list[str]) -> int:
    """The job itself: the script with its output appended to `out`; its end recorded."""
    with open(out, "a") as log:
        record(job_id, state="RUNNING")
        code = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        ).returncode
    record(job_id, state="COMPLETED" if code == 0 else "FAILED", exit_code=code)
    return code


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
    children = []
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
    return next((c for c in codes.values() if c), 0)


def scontrol(argv: list[str]) -> int:
    if argv[:2] == ["show", "hostnames"]:
        print("\n".join(hostnames(argv[2] if len(argv) > 2 else os.environ["SLURM_JOB_NODELIST"])))
        return 0
    if argv[:2] == ["show", "node"] and len(argv) > 2:
        print(
            f"NodeName={argv[2]} Arch=x86_64 CoresPerSocket=1\n   NodeAddr={NODE_ADDR} NodeHostName={argv[2]}"
        )
        return 0
    fail(f"not simulated: scontrol {' '.join(argv)}", 1)
    return 1


if __name__ == "__main__":
    name, args = Path(sys.argv[0]).name, sys.argv[1:]
    if name == "fakeslurm.py" and args and args[0] == "_run":
        sys.exit(run_job(int(args[1]), args[2], args[3:]))
    commands = {"sbatch": sbatch, "srun": srun, "scontrol": scontrol}
    if name not in commands:
        fail(f"run as one of {', '.join(commands)} (a link named so)", 2)
    sys.exit(commands[name](args))
