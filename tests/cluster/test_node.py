"""The cluster launchers: the node launcher, the Slurm array script and the retrieval service script,
run as a user runs them, with a fake `nvidia-smi` and Slurm's variables."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from corag.retrieval.bm25 import BM25Retriever, build_bm25_folder
from corag.retrieval.client import RetrieverClient

ROOT = Path(__file__).resolve().parents[2]

# Stands for `corag sample` and `corag evaluate`: records its arguments, devices and whether the service
# it was given answers, one JSON line per run; as `evaluate` (given --out-dir), writes a run's metrics.
RECORDER = """
import json, os, sys
from pathlib import Path
import httpx
argv = sys.argv[1:]
row = {"argv": argv, "devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
if "--retriever" in argv and argv[argv.index("--retriever") + 1].startswith("http"):
    row["health"] = httpx.get(argv[argv.index("--retriever") + 1] + "/health").status_code
with open(os.environ["LAUNCH_RECORD"], "a") as f:
    f.write(json.dumps(row) + "\\n")
if "--out-dir" in argv:
    run = Path(argv[argv.index("--out-dir") + 1]) / "greedy_L6"
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.json").write_text(json.dumps({"run": "greedy:L=6", "count": 2, "em": 50.0, "f1": 60.0}))
def given(flag):
    return flag in argv and "--shard" in argv and argv[argv.index(flag) + 1] == argv[argv.index("--shard") + 1]
if given("--stop-part"):
    sys.exit(75)  # stopped on Slurm's warning (corag.cluster.stop.STOPPED)
if given("--fail-part"):
    sys.exit(3)
sys.exit(3 if "--fail" in sys.argv else 0)
"""


@pytest.fixture
def cluster(tmp_path):
    """A folder with a fake nvidia-smi listing 8 GPUs, a recorder command and a sampling config."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA H100 (UUID: GPU-$i)"; done\n'
    )
    smi.chmod(0o755)
    (tmp_path / "record.py").write_text(RECORDER)
    config = tmp_path / "sample.yaml"
    config.write_text("model: m\nnum_shards: 6\ntensor_parallel_size: 2\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_VISIBLE_DEVICES"))}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        PYTHON=sys.executable,
        PYTHONPATH=f"{ROOT}:{env.get('PYTHONPATH', '')}",
        LAUNCH_RECORD=str(tmp_path / "record.jsonl"),
    )
    return tmp_path, config, env


def launch(cluster, *args: str, env: dict | None = None, script: str = "launch_node.sh"):
    tmp, config, base = cluster
    command = f"{sys.executable} {tmp / 'record.py'}"
    argv = ["bash", str(ROOT / "sampling" / script), str(config), *args]
    if script == "launch_node.sh":
        argv[3:3] = ["--command", command, "--log-dir", str(tmp / "logs")]
    else:
        base = {**base, "CORAG_LAUNCH_COMMAND": command}
    return subprocess.run(argv, env={**base, **(env or {})}, cwd=tmp, capture_output=True, text=True)


def records(cluster) -> list[dict]:
    path = cluster[0] / "record.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    for row in rows:
        argv = row["argv"]
        row["shard"] = int(argv[len(argv) - 1 - argv[::-1].index("--shard") + 1])
        row["num_shards"] = int(argv[argv.index("--num_shards") + 1])
    return rows


def test_engines_get_tensor_parallel_groups_of_the_listed_gpus(cluster):
    done = launch(cluster, "--", "--limit", "10")
    assert done.returncode == 0, done.stderr
    rows = records(cluster)
    assert sorted(r["shard"] for r in rows) == list(range(6)) and {r["num_shards"] for r in rows} == {6}
    by_devices: dict[str, list[int]] = {}
    for r in rows:
        by_devices.setdefault(r["devices"], []).append(r["shard"])
        assert r["argv"][r["argv"].index("--limit") + 1] == "10"
    assert {d: sorted(s) for d, s in by_devices.items()} == {
        "0,1": [0, 4],
        "2,3": [1, 5],
        "4,5": [2],
        "6,7": [3],
    }
    assert sorted(p.name for p in (cluster[0] / "logs").iterdir()) == [
        f"sample-shard-{i:05d}.log" for i in range(6)
    ]


# Stands for a shard that samples until Slurm's warning: records its start, then stops (status 75).
WARNED = """
import json, os, signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
with open(os.environ["LAUNCH_RECORD"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "devices": os.environ.get("CUDA_VISIBLE_DEVICES")}) + "\\n")
while not got:
    time.sleep(0.05)
sys.exit(75)
"""


def test_the_warning_signal_stops_the_running_shards_and_starts_no_other(cluster):
    """SIGUSR1 (Slurm's warning, passed on by the batch shell): each engine's shard in hand stops, the
    launcher starts no further shard and exits 75 so the job requeues; logs carry the array task."""
    tmp, config, env = cluster
    (tmp / "warned.py").write_text(WARNED)
    argv = ["bash", str(ROOT / "sampling" / "launch_node.sh"), str(config), "--log-dir", str(tmp / "logs")]
    argv[3:3] = ["--command", f"{sys.executable} {tmp / 'warned.py'}"]
    proc = subprocess.Popen(
        argv, env={**env, **slurm_array_env(cluster)}, cwd=tmp, stderr=subprocess.PIPE, text=True
    )
    while len(records(cluster)) < 1:  # one engine of 2 GPUs: its first shard runs
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert [r["shard"] for r in records(cluster)] == [0]  # shards 1-5 never started
    assert "after shard(s) [0] saved what they had sampled (not started: [1, 2, 3, 4, 5])" in err
    assert [p.name for p in (tmp / "logs").iterdir()] == ["sample-77_1-shard-00000.log"]


def test_the_allocations_devices_are_respected(cluster):
    done = launch(cluster, env={"CUDA_VISIBLE_DEVICES": "5,6,7"})
    assert done.returncode == 0, done.stderr
    rows = records(cluster)
    assert {r["devices"] for r in rows} == {"5,6"}  # one engine of 2; GPU 7 left over
    assert sorted(r["shard"] for r in rows) == list(range(6))
    assert "7 left unused" in done.stderr


def test_slurm_gpus_without_cuda_visible_devices(cluster):
    done = launch(cluster, "--tensor-parallel-size", "1", env={"SLURM_JOB_GPUS": "2,3"})
    assert done.returncode == 0, done.stderr
    rows = records(cluster)
    assert {r["devices"] for r in rows} == {"2", "3"}
    assert all(r["argv"][r["argv"].index("--tensor_parallel_size") + 1] == "1" for r in rows)


def test_shard_names_do_not_depend_on_the_hardware(cluster):
    """Two nodes of 4 GPUs, then three nodes of 2 GPUs: the same six shard names each time."""
    for node in range(2):
        env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
        assert launch(cluster, "--node-index", str(node), "--num-nodes", "2", env=env).returncode == 0
    first = records(cluster)
    (cluster[0] / "record.jsonl").unlink()
    for node in range(3):
        env = {"CUDA_VISIBLE_DEVICES": "0,1"}
        assert launch(cluster, "--node-index", str(node), "--num-nodes", "3", env=env).returncode == 0
    second = records(cluster)
    assert sorted(r["shard"] for r in first) == sorted(r["shard"] for r in second) == list(range(6))


def test_cpu_only_node_runs_one_engine(cluster, tmp_path):
    broken = tmp_path / "no-gpu"
    broken.mkdir()
    (broken / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    (broken / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{broken}:{Path(sys.executable).parent}:/usr/bin:/bin"}  # a driver-less node
    done = launch(cluster, env=env)
    assert done.returncode == 0, done.stderr
    rows = records(cluster)
    assert [r["shard"] for r in rows] == list(range(6)) and {r["devices"] for r in rows} == {None}


def test_bad_launches_are_refused(cluster):
    tmp, config, _ = cluster
    done = launch(cluster, "--node-index", "2", "--num-nodes", "2")
    assert done.returncode == 2 and "node-index" in done.stderr
    config.write_text("model: m\n")
    done = launch(cluster)
    assert done.returncode == 2 and "num_shards" in done.stderr and records(cluster) == []
    config.write_text("model: m\nnum_shards: 2\ntensor_parallel_size: 4\n")
    done = launch(cluster, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert done.returncode == 2 and "tensor_parallel_size" in done.stderr


def test_a_failed_shard_fails_the_node_after_the_others_ran(cluster):
    done = launch(cluster, "--", "--fail")
    assert done.returncode == 1 and "failed" in done.stderr
    assert sorted(r["shard"] for r in records(cluster)) == list(range(6))


@pytest.mark.parametrize(
    "task, first, last, step, node, nodes",
    [(17, 16, 17, None, 1, 2), (0, 0, 2, None, 0, 3), (4, 0, 4, 2, 2, 3)],
)
def test_slurm_array_from_any_offset(cluster, task, first, last, step, node, nodes):
    env = {
        "SLURM_ARRAY_TASK_ID": str(task),
        "SLURM_ARRAY_TASK_MIN": str(first),
        "SLURM_ARRAY_TASK_MAX": str(last),
        "SLURM_SUBMIT_DIR": str(cluster[0]),
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    if step is not None:
        env["SLURM_ARRAY_TASK_STEP"] = str(step)
    done = launch(cluster, "--", "--limit", "5", env=env, script="slurm_array.sh")
    assert done.returncode == 0, done.stderr
    assert f"engine {node} on 0,1" in done.stderr
    assert [r["shard"] for r in records(cluster)] == list(range(node, 6, nodes))
    assert (cluster[0] / "logs").is_dir()


def test_slurm_array_outside_an_array_job_says_so(cluster):
    done = launch(cluster, script="slurm_array.sh")
    assert done.returncode != 0 and "sbatch --array" in done.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_retriever_script_writes_its_url(cluster, toy_world):
    tmp, _, env = cluster
    build_bm25_folder([toy_world.passages], tmp / "bm25")
    port = free_port()
    url_file = tmp / "run" / "retriever.url"
    env = {**env, "PORT": str(port), "CORAG_SERVICE_HOST": "127.0.0.1"}
    script = [str(ROOT / "sampling" / "serve_retriever.sh"), str(tmp / "bm25"), str(url_file)]
    proc = subprocess.Popen(
        ["bash", *script], env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while not url_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
            time.sleep(0.2)
        url = url_file.read_text().strip()
        assert url == f"http://127.0.0.1:{port}"
        queries = ["What is the country of Netu?"]
        with RetrieverClient(url) as client:
            assert client.search(queries, 3) == BM25Retriever.from_passages(toy_world.passages).search(
                queries, 3
            )
        assert httpx.get(f"{url}/health").json()["index"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not url_file.exists()


def test_every_shipped_sampling_config_is_launchable():
    from corag.cluster.node import SampleArgs, check_config

    configs = sorted((ROOT / "configs" / "sampling").glob("*.yaml"))
    assert {p.name for p in configs} >= {"llama3.1-8b.yaml", "qwen3-8b.yaml", "toy.yaml"}
    for path in configs:
        num_shards, tp = check_config(SampleArgs(config=str(path)))
        assert num_shards >= 1 and tp >= 1, path


def test_slurm_array_passes_launcher_flags(cluster):
    env = {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "0"}
    env["CUDA_VISIBLE_DEVICES"] = "0,1"
    done = launch(cluster, "--num-shards", "3", "--", "--limit", "5", env=env, script="slurm_array.sh")
    assert done.returncode == 0, done.stderr
    rows = records(cluster)
    assert sorted(r["shard"] for r in rows) == [0, 1, 2] and {r["num_shards"] for r in rows} == {3}


def test_slurm_physical_gpu_ids_are_renumbered_inside_the_jobs_cgroup(cluster, tmp_path):
    """SLURM_JOB_GPUS=5,6 on a node whose nvidia-smi shows only those two: CUDA calls them 0 and 1."""
    two = tmp_path / "two-gpus"
    two.mkdir()
    (two / "nvidia-smi").write_text('#!/bin/sh\necho "GPU 0: H100 (UUID: a)"\necho "GPU 1: H100 (UUID: b)"\n')
    (two / "nvidia-smi").chmod(0o755)
    env = {"SLURM_JOB_GPUS": "5,6", "PATH": f"{two}:{os.environ['PATH']}"}
    done = launch(cluster, "--tensor-parallel-size", "1", env=env)
    assert done.returncode == 0, done.stderr
    assert {r["devices"] for r in records(cluster)} == {"0", "1"}


def slurm_array_env(cluster) -> dict:
    return {
        "SLURM_ARRAY_TASK_ID": "1",
        "SLURM_ARRAY_TASK_MIN": "0",
        "SLURM_ARRAY_TASK_MAX": "1",
        "SLURM_ARRAY_JOB_ID": "77",
        "SLURM_JOB_ID": "78",
        "SLURM_SUBMIT_DIR": str(cluster[0]),
        "CUDA_VISIBLE_DEVICES": "0,1",
    }


def test_array_started_before_the_service_waits_for_it(cluster, toy_world):
    """The array task starts first and waits; the real service comes up later, writes its URL file,
    and every shard gets that URL."""
    tmp, config, env = cluster
    build_bm25_folder([toy_world.passages], tmp / "bm25")
    url_file = tmp / "run" / "retriever.url"
    array_env = {
        **env,
        **slurm_array_env(cluster),
        "CORAG_LAUNCH_COMMAND": f"{sys.executable} {tmp / 'record.py'}",
    }
    array = subprocess.Popen(
        ["bash", str(ROOT / "sampling" / "slurm_array.sh"), str(config), "--retriever-url-file", str(url_file),
         "--wait-minutes", "3", "--", "--limit", "5"],
        env=array_env, cwd=tmp, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    service = None
    try:
        cpus = array.stderr.readline()  # the runner's first line: the CPUs it may use
        assert "CPU(s) usable" in cpus, cpus
        first = array.stderr.readline()  # the task is up and waiting before the service exists
        assert "waiting for the retrieval service" in first and str(url_file) in first, first
        port = free_port()
        service = subprocess.Popen(
            ["bash", str(ROOT / "sampling" / "serve_retriever.sh"), str(tmp / "bm25"), str(url_file)],
            env={**env, "PORT": str(port), "CORAG_SERVICE_HOST": "127.0.0.1"},
            cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        rest = array.stderr.read()
        assert array.wait(timeout=180) == 0, rest
    finally:
        if array.poll() is None:
            array.kill()
        if service is not None:
            service.terminate()
            service.wait(timeout=30)
    url = f"http://127.0.0.1:{port}"
    assert f"retrieval service at {url}" in rest
    rows = records(cluster)
    assert [r["shard"] for r in rows] == [1, 3, 5]  # node 1 of 2, one engine of 2 GPUs
    assert all(r["argv"][r["argv"].index("--retriever") + 1] == url for r in rows)


def test_each_node_starts_its_own_service_and_stops_it_when_the_shards_end(cluster, toy_world):
    """--serve-index: the layout of the shipped configs. The task starts its node's service over the
    index, every shard gets its URL while it answers, and it is gone when the task ends."""
    tmp = cluster[0]
    build_bm25_folder([toy_world.passages], tmp / "bm25")
    done = launch(
        cluster, "--serve-index", str(tmp / "bm25"), env=slurm_array_env(cluster), script="slurm_array.sh"
    )
    assert done.returncode == 0, done.stderr
    rows = records(cluster)
    assert [r["shard"] for r in rows] == [1, 3, 5] and all(r["health"] == 200 for r in rows)
    (url,) = {r["argv"][r["argv"].index("--retriever") + 1] for r in rows}
    assert url.startswith("http://127.0.0.1:") and f"retrieval service at {url}" in done.stderr
    assert "serving" in (tmp / "logs" / "retriever-77_1-node1.log").read_text()  # node 1's own, by task
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/health", timeout=5)  # stopped with the task


def test_a_service_that_cannot_start_fails_the_task_at_once(cluster):
    tmp = cluster[0]
    started = time.monotonic()
    done = launch(
        cluster, "--serve-index", str(tmp / "no-index"), env=slurm_array_env(cluster), script="slurm_array.sh"
    )
    assert done.returncode == 2 and not records(cluster)
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert "no-index" in line and "exited with status" in line and "retriever-77_1-node1.log" in line
    assert time.monotonic() - started < 120  # not the 30 minutes of --wait-minutes
    both = launch(cluster, "--serve-index", "x", "--retriever-url-file", "y")
    assert both.returncode == 2 and "not both" in both.stderr


def test_the_wait_is_bounded_and_names_the_file(cluster):
    tmp, _, _ = cluster
    url_file = tmp / "run" / "retriever.url"
    args = ["--retriever-url-file", str(url_file), "--wait-minutes", "0.02"]
    done = launch(cluster, *args, env=slurm_array_env(cluster), script="slurm_array.sh")
    assert done.returncode == 2 and records(cluster) == []
    error = done.stderr.strip().splitlines()[-1]
    assert str(url_file) in error and "never written" in error and "0.02 min" in error
    url_file.parent.mkdir()
    url_file.write_text(f"http://127.0.0.1:{free_port()}\n")  # left by a service that was killed
    done = launch(cluster, *args, env=slurm_array_env(cluster), script="slurm_array.sh")
    assert done.returncode == 2 and "never answered" in done.stderr and records(cluster) == []


def evaluate(cluster, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    tmp, config, base = cluster
    base = {
        **base,
        "CORAG_EVAL_COMMAND": f"{sys.executable} {tmp / 'record.py'}",
        "SLURM_SUBMIT_DIR": str(tmp),
    }
    argv = ["bash", str(ROOT / "evaluation" / "slurm_eval.sh"), str(config), *args]
    return subprocess.run(argv, env={**base, **(env or {})}, cwd=tmp, capture_output=True, text=True)


def arg(row: dict, flag: str) -> str:
    return row["argv"][row["argv"].index(flag) + 1]


def test_evaluation_splits_every_file_over_the_gpus_through_the_waited_for_service(cluster, toy_world):
    from corag.retrieval.service import BackgroundServer, create_app

    tmp = cluster[0]
    url_file = tmp / "run" / "retriever.url"
    url_file.parent.mkdir()
    names = ["hotpotqa", "musique", "2wiki"]
    data = [w for n in names for w in ("--data", f"d/{n}.jsonl")]
    with BackgroundServer(create_app(BM25Retriever.from_passages(toy_world.passages))) as service:
        url_file.write_text(service.url + "\n")
        args = ["--retriever-url-file", str(url_file), *data, "--", "--methods", "greedy:L=6"]
        done = evaluate(cluster, *args, env={"CUDA_VISIBLE_DEVICES": "3,4"})
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp / "record.jsonl").read_text().splitlines()]
    parts = [r for r in rows if "--merge" not in r["argv"]]
    # every file in 2 parts, part s on the s-th GPU, each through the service
    assert sorted((arg(r, "--data"), arg(r, "--shard"), r["devices"]) for r in parts) == sorted(
        (f"d/{n}.jsonl", str(s), d) for n in names for s, d in ((0, "3"), (1, "4"))
    )
    assert {arg(r, "--num-shards") for r in rows} == {"2"}
    for row in parts:
        assert arg(row, "--retriever") == service.url and "greedy:L=6" in row["argv"]
        assert arg(row, "--out-dir") == f"runs/eval/{Path(arg(row, '--data')).stem}"
    merges = [r for r in rows if "--merge" in r["argv"]]  # after every part, one a file
    assert sorted(arg(r, "--data") for r in merges) == sorted(f"d/{n}.jsonl" for n in names)
    assert rows[-3:] == merges
    logs = [re.fullmatch(r"corag-eval-\d+-(\w+)-part(\d)\.log", p.name) for p in (tmp / "logs").iterdir()]
    assert sorted((m[1], int(m[2])) for m in logs if m) == sorted((n, s) for n in names for s in (0, 1))


def test_evaluation_serves_its_own_index_and_merges_one_table(cluster, toy_world):
    tmp = cluster[0]
    build_bm25_folder([toy_world.passages], tmp / "bm25")
    data = ["--data", "d/hotpotqa.jsonl", "--data", "d/musique.jsonl"]
    done = evaluate(cluster, "--serve-index", str(tmp / "bm25"), *data, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp / "record.jsonl").read_text().splitlines()]
    parts = [r for r in rows if "--merge" not in r["argv"]]
    assert len(parts) == 4 and all(r["health"] == 200 for r in parts) and len(rows) == 6
    (url,) = {arg(r, "--retriever") for r in parts}
    assert url.startswith("http://127.0.0.1:")
    table = (tmp / "runs" / "eval" / "results.md").read_text().splitlines()
    assert table[0].startswith("| dataset | run | count | em | paper_em | f1 | paper_f1 |")
    assert sorted(table[2:]) == [  # each measured figure beside the paper's Table 1 figure
        "| hotpotqa | greedy:L=6 | 2 | 50.0 | 54.4 | 60.0 | 67.5 |  |  |",
        "| musique | greedy:L=6 | 2 | 50.0 | 27.7 | 60.0 | 38.5 |  |  |",
    ]
    assert not list((tmp / "logs").glob("*.url"))  # the service stopped and took its URL file along
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/health", timeout=5)


def test_evaluation_with_a_part_stopped_on_the_warning_merges_nothing_and_exits_stopped(cluster):
    """A part that stopped on Slurm's warning (status 75) starts no other file; the other parts go on,
    no file is merged, no table written, and the job exits 75 (in a Slurm job: requeued)."""
    tmp = cluster[0]
    data = ["--data", "d/hotpotqa.jsonl", "--data", "d/musique.jsonl"]
    done = evaluate(cluster, *data, "--", "--stop-part", "0", env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert done.returncode == 75, done.stderr
    rows = [json.loads(line) for line in (tmp / "record.jsonl").read_text().splitlines()]
    assert sorted((arg(r, "--data"), arg(r, "--shard")) for r in rows) == [
        ("d/hotpotqa.jsonl", "0"),
        ("d/hotpotqa.jsonl", "1"),
        ("d/musique.jsonl", "1"),
    ]  # part 0 stopped on its first file; no merge
    assert "part 0 of d/hotpotqa.jsonl stopped on the warning before the time limit" in done.stderr
    assert "no file merged, the rerun resumes" in done.stderr
    assert not (tmp / "runs" / "eval" / "results.md").exists()


# Stands for srun in a job of N nodes: the command once a node (SLURM_PROCID), and the highest status of the
# nodes, as srun reports it.
SRUN = """#!/usr/bin/env bash
nodes=1
while [[ "$1" == --* ]]; do [[ "$1" != --nodes=* ]] || nodes=${1#--nodes=}; shift; done
pids=()
for (( i = 0; i < nodes; i++ )); do SLURM_PROCID=$i "$@" & pids+=($!); done
highest=0
for pid in "${pids[@]}"; do code=0; wait "$pid" || code=$?; (( code <= highest )) || highest=$code; done
exit $highest
"""


def test_evaluation_with_one_node_failed_and_another_stopped_fails_and_is_not_requeued(cluster):
    """Two nodes: part 0 stops on the warning (75), part 1 fails. srun reports 75, the highest; the job still
    fails (status 1, the failure said), and the batch shell does not requeue it."""
    tmp = cluster[0]
    for name, text in (("srun", SRUN), ("scontrol", f'#!/bin/sh\necho "$@" >> {tmp}/scontrol.txt\n')):
        (tmp / "bin" / name).write_text(text)
        (tmp / "bin" / name).chmod(0o755)
    env = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "CUDA_VISIBLE_DEVICES": "0"}
    flags = ["--", "--stop-part", "0", "--fail-part", "1"]
    done = evaluate(cluster, "--data", "d/hotpotqa.jsonl", *flags, env=env)
    assert done.returncode == 1, done.stderr
    assert "part 1 of d/hotpotqa.jsonl failed" in done.stderr and "a part failed" in done.stderr
    assert not (tmp / "scontrol.txt").exists()  # not requeued
    assert not list((tmp / "logs").glob("failed-*"))  # the mark is gone with the job


def test_evaluation_whose_service_cannot_start_fails_at_once(cluster):
    done = evaluate(cluster, "--serve-index", str(cluster[0] / "no-index"), "--data", "d.jsonl")
    assert done.returncode == 2 and not (cluster[0] / "record.jsonl").exists()
    assert "exited with status" in done.stderr and "before answering" in done.stderr


def test_evaluation_wait_is_bounded(cluster):
    url_file = cluster[0] / "nowhere.url"
    done = evaluate(
        cluster, "--retriever-url-file", str(url_file), "--wait-minutes", "0.01", "--data", "d.jsonl"
    )
    assert done.returncode == 2 and not (cluster[0] / "record.jsonl").exists()
    assert str(url_file) in done.stderr and "never written" in done.stderr


# The node runner's own rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "listed", "devices"),
    [
        ({"CUDA_VISIBLE_DEVICES": "2,5"}, 8, ["2", "5"]),  # set by Slurm or the user: taken as it is
        ({"CUDA_VISIBLE_DEVICES": "2,5", "SLURM_JOB_GPUS": "6,7"}, 2, ["2", "5"]),
        ({"CUDA_VISIBLE_DEVICES": ""}, 8, None),  # set empty: no GPUs
        ({"CUDA_VISIBLE_DEVICES": "-1"}, 8, None),
        ({"SLURM_JOB_GPUS": "4,6"}, 2, ["0", "1"]),  # the job's cgroup shows its 2 GPUs only: renumbered
        ({"SLURM_JOB_GPUS": "4,6"}, 8, ["4", "6"]),  # every GPU visible: the physical ids
        ({"SLURM_STEP_GPUS": "3", "SLURM_JOB_GPUS": "2,3"}, 1, ["0"]),  # the step's before the job's
        ({}, 4, ["0", "1", "2", "3"]),  # no Slurm: every GPU nvidia-smi lists
        ({}, 0, None),  # no GPU at all: one engine on the CPU
    ],
)
def test_the_one_device_rule(env, listed, devices, monkeypatch):
    import corag.cluster.node as node

    monkeypatch.setattr(node, "_listed_gpus", lambda: listed)
    assert node.visible_devices(env) == devices
    assert node.engine_devices(devices, 1) == ([[d] for d in devices] if devices else [None])


def test_usable_cpus_are_logged_and_fewer_than_asked_is_one_warning(capsys):
    from corag.cluster.node import log_cpus

    assert log_cpus({"SLURM_CPUS_PER_TASK": "2", "SLURMD_NODENAME": "node1"}, {0, 1}) == 2
    assert capsys.readouterr().err == "node: 2 CPU(s) usable on node1 (0-1); the job asked 2 a task\n"
    log_cpus({"SLURM_CPUS_PER_TASK": "64", "SLURMD_NODENAME": "node2"}, {0, 1, 2, 5})
    assert capsys.readouterr().err.splitlines() == [
        "node: 4 CPU(s) usable on node2 (0-2,5); the job asked 64 a task",
        "node: warning: 4 CPU(s) usable here, fewer than the 64 the job asked (--cpus-per-task)",
    ]


def test_every_srun_passes_the_jobs_cpus_per_task():
    from corag.cluster.node import srun

    assert srun({"SLURM_CPUS_PER_TASK": "16"}, 2) == [
        "srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=16"
    ]  # fmt: skip
    assert "--cpus-per-task" not in " ".join(srun({}, 1))


def runner(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(
        [sys.executable, "-m", "corag.cluster.node", *args],
        env={**base, **(env or {})}, cwd=cwd or ROOT, capture_output=True, text=True,
    )  # fmt: skip


def test_bad_starts_of_the_runner_and_its_scripts_are_one_line(tmp_path):
    """An unknown stage, training outside a Slurm job, a training script given an unknown recipe."""
    done = runner("smaple", "x.yaml")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "corag node: error: field 'stage': no stage 'smaple': the node runner runs sample, evaluate, train, "
        "serve, pool"
    ]
    done = runner("train", "sft", "ddp", "configs/sft/toy.yaml")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "not in a Slurm job (no SLURM_NNODES): submit it with sbatch --nodes=N" in done.stderr
    script = subprocess.run(
        ["bash", str(ROOT / "recipes" / "slurm_train.sh"), "dpo", "ddp", "configs/sft/toy.yaml"],
        env={**os.environ, "PYTHON": sys.executable}, cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert script.returncode == 2
    assert script.stderr.splitlines() == [
        "corag node: error: field 'recipe': the recipe is sft or grpo, not 'dpo' (train "
        "sft|grpo zero3|fsdp|ddp|ACCELERATE_YAML CONFIG [--serve-index INDEX] [recipe flags])"
    ]


def test_the_watchdog_ends_a_node_left_alive_after_the_others_ended(tmp_path, monkeypatch, capsys):
    """Node 0 ended training (its mark, status 0); node 1's process never ends (a teardown deadlock): a
    bounded time later the step is ended, with a line saying so, and the job ends as node 0 did."""
    from corag.cluster.node import Children, watch_nodes

    monkeypatch.setenv("CORAG_EXIT_WATCHDOG_SECONDS", "1")
    (tmp_path / "ended-7-node0").write_text("0\n")
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    start = time.monotonic()
    assert watch_nodes(Children(), hung, tmp_path, "7", 2) == 0
    assert hung.poll() is not None and time.monotonic() - start < 60
    assert capsys.readouterr().err.splitlines() == [
        "node: watchdog: node(s) [1] still running 1 s after node(s) [0] ended training: ending them (a "
        "process left alive at exit)"
    ]
