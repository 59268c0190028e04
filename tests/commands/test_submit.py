"""corag submit: sbatch runs with the flags, the script and its arguments as given once some node of the
partition can run the job; otherwise one line naming the option, and nothing queued (sinfo and sbatch
are stubs that print canned nodes and record their argv)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from corag.cli import main

REPO = Path(__file__).resolve().parents[2]
STUB_SBATCH = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["STUB_RECORD"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
print("Submitted batch job 7")
sys.exit(int(os.environ.get("STUB_SBATCH_EXIT", "0")))
"""


@pytest.fixture
def cluster(tmp_path, monkeypatch) -> Path:
    """sinfo listing two nodes of 2 CPUs, 8000 MB and 8 GPUs; sbatch recording to the returned file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text("#!/bin/sh\necho 'debug* 2 2 8000 gpu:8'\n")
    (bin_dir / "sbatch").write_text(STUB_SBATCH)
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("STUB_RECORD", str(tmp_path / "record.jsonl"))
    monkeypatch.chdir(REPO)
    return tmp_path / "record.jsonl"


def submitted(record: Path) -> list[list[str]]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def test_a_job_that_fits_goes_to_sbatch_as_given(cluster, capfd):
    argv = ["recipes/slurm_train.sh", "--nodes=2", "--cpus-per-task", "2", "--mem=7G", "--wait", "--",
            "grpo", "zero3", "configs/grpo/toy.yaml", "--serve-index", "data/index", "--max_steps", "2"]  # fmt: skip
    assert main(["submit", *argv]) == 0
    assert submitted(cluster) == [[*argv[1:6], "recipes/slurm_train.sh", *argv[7:]]]
    out = capfd.readouterr()  # sbatch's own output too
    assert "Submitted batch job 7" in out.out and "partition 'debug' has nodes that can run" in out.err
    argv = ["sampling/slurm_array.sh", "--array=0-1", "--", "configs/sampling/toy.yaml", "--", "--limit", "2"]
    assert main(["submit", *argv]) == 0  # the script's own `--` stays its own
    assert submitted(cluster)[-1] == ["--array=0-1", "sampling/slurm_array.sh", *argv[3:]]


def test_sbatch_failing_is_the_exit_status(cluster, monkeypatch):
    monkeypatch.setenv("STUB_SBATCH_EXIT", "1")
    assert main(["submit", "sampling/serve_retriever.sh", "--", "index", "url"]) == 1


@pytest.mark.parametrize(
    ("argv", "end"),
    [
        (["recipes/slurm_train.sh", "--cpus-per-task=64", "--", "sft", "ddp", "c.yaml"],
         "recipes/slurm_train.sh: --cpus-per-task=64 asks 64 CPU(s) a node, and no node of partition 'debug' "
         "has more than 2, so it could never start; ask at most 2 CPU(s)"),
        (["sampling/serve_retriever.sh", "--mem=160G"], "--mem=160G asks 163840 MB of memory a node, and no "
         "node of partition 'debug' has more than 8000, so it could never start; ask at most 8000 MB of memory"),
        (["recipes/slurm_train.sh", "--nodes=4"], "--nodes=4 asks 4 nodes of 8 GPU(s) and 1 CPU(s), and "
         "partition 'debug' has 2"),
        (["evaluation/slurm_eval.sh", "-p", "gpu"], "no partition 'gpu'; sinfo lists debug"),
        (["--nodes=2", "recipes/slurm_train.sh"], "the batch script comes first (usage: corag submit SCRIPT "
         "[SBATCH_FLAGS ...] [-- SCRIPT_ARGS ...])"),
        (["nosuch.sh"], "nosuch.sh: no such batch script"),
    ],
)  # fmt: skip
def test_what_cannot_run_is_one_line_and_nothing_queued(cluster, capsys, argv, end):
    assert main(["submit", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("corag submit: error: ") and err.endswith(f"{end}\n") and err.count("\n") == 1, err
    assert submitted(cluster) == []


def test_without_sinfo_or_when_it_fails(cluster, capsys):
    (cluster.parent / "bin" / "sinfo").unlink()
    assert main(["submit", "recipes/slurm_train.sh"]) == 2
    assert capsys.readouterr().err.endswith(
        "no sinfo here: run corag where Slurm's commands are (a login node)\n"
    )
    (cluster.parent / "bin" / "sinfo").write_text(
        "#!/bin/sh\necho 'slurm_load_partitions: Unable to contact' >&2\nexit 1\n"
    )
    (cluster.parent / "bin" / "sinfo").chmod(0o755)
    assert main(["submit", "recipes/slurm_train.sh"]) == 2
    assert capsys.readouterr().err.endswith("sinfo failed: slurm_load_partitions: Unable to contact\n")
    assert submitted(cluster) == []
