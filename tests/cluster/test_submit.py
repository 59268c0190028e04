"""corag.cluster.submit: what a job asks of a node, from a script's #SBATCH lines and sbatch's flags, against the
nodes sinfo lists (canned here); a job no node can ever run is one line naming the option."""

from __future__ import annotations

from pathlib import Path

import pytest

from corag.cluster.submit import check, header_options, parse_gres, parse_request, parse_sinfo, parse_time
from corag.errors import InputError

REPO = Path(__file__).resolve().parents[2]

# `sinfo -h -e -o '%P %D %c %m %G'` on the one-machine Slurm of DESIGN.md (nodes of 2 CPUs and 8000 MB)
SMALL = "debug* 2 2 8000 gpu:8\n"
# ... and on a cluster of H100 nodes, CPU nodes and a partition of smaller A100 nodes
CLUSTER = """gpu* 16 64 1031000 gpu:h100:8(S:0-1)
gpu* 2 64 515000 gpu:h100:8(S:0-1)
cpu 40 128 257000 (null)
small 4 16 64000 gpu:a100:4(S:0),shard:8
"""
OLD_TRAIN_HEADER = [
    "--nodes=2",
    "--ntasks-per-node=1",
    "--gpus-per-node=8",
    "--cpus-per-task=64",
    "--mem=512G",
]


def fits(sinfo: str, header: list[str], flags: list[str] = ()) -> str:
    """The partition that can run the job (an InputError otherwise)."""
    return check(parse_request(header, list(flags)), *parse_sinfo(sinfo))


def refusal(sinfo: str, header: list[str], flags: list[str] = ()) -> str:
    with pytest.raises(InputError) as error:
        fits(sinfo, header, flags)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_sinfo_lines_and_generic_resources():
    groups, default = parse_sinfo(CLUSTER)
    assert default == "gpu" and [g.count for g in groups] == [16, 2, 40, 4]
    assert (groups[0].cpus, groups[0].memory_mb, groups[0].gpus) == (64, 1031000, {"h100": 8})
    assert groups[2].gpus == {} and groups[3].gpu_count(None) == 4 and groups[3].gpu_count("h100") == 0
    assert parse_gres("gpu:a100:2(S:0,1),gpu:v100:2") == {"a100": 2, "v100": 2}
    assert parse_gres("gpu:8,shard:16") == {None: 8} and parse_gres("(null)") == {}
    with pytest.raises(InputError, match="sinfo's line 1 is not PARTITION NODES"):
        parse_sinfo("debug* up 2\n")


def test_the_shipped_launchers_fit_a_small_node():
    for script in ("recipes/slurm_train.sh", "sampling/slurm_array.sh", "evaluation/slurm_eval.sh",
                   "sampling/serve_retriever.sh", "sampling/slurm_pool.sh"):  # fmt: skip
        header = header_options((REPO / script).read_text())
        assert not [w for w in header if w.startswith(("--mem", "--cpus-per-task"))], script
        assert fits(SMALL, header) == "debug", script
    header = header_options((REPO / "recipes/slurm_train.sh").read_text())
    assert "--nodes=2" in header and "--gpus-per-node=8" in header


def test_what_no_node_has_is_refused_naming_the_option():
    message = refusal(SMALL, OLD_TRAIN_HEADER)
    assert message.startswith(
        "#SBATCH --cpus-per-task=64 asks 64 CPU(s) a node, and no node of partition 'debug'"
    )
    # every option no node meets, in one line: the CPUs and the memory
    assert "has more than 2, so it could never start; ask at most 2 CPU(s); and #SBATCH --mem=512G" in message
    assert message.endswith("has more than 8000, so it could never start; ask at most 8000 MB of memory")
    # the command line wins over the script's lines
    message = refusal(SMALL, OLD_TRAIN_HEADER, ["--cpus-per-task", "2"])
    assert (
        message.startswith("#SBATCH --mem=512G asks 524288 MB of memory a node")
        and "more than 8000" in message
    )
    assert fits(SMALL, OLD_TRAIN_HEADER, ["-c2", "--mem=7G"]) == "debug"
    assert fits(SMALL, OLD_TRAIN_HEADER, ["-c", "1", "--mem=0"]) == "debug"  # --mem=0: all of a node's
    assert refusal(SMALL, [], ["--mem=160G"]).startswith("--mem=160G asks 163840 MB")
    assert "--mem-per-cpu=4G asks 8192 MB" in refusal(SMALL, [], ["-c", "2", "--mem-per-cpu=4G"])
    assert "--ntasks-per-node=4 asks 4 CPU(s)" in refusal(SMALL, [], ["--ntasks-per-node=4"])


def test_gpus_by_count_and_kind():
    assert "--gpus-per-node=16 asks 16 GPU(s) a node" in refusal(SMALL, [], ["--gpus-per-node=16"])
    assert fits(CLUSTER, [], ["--gres=gpu:h100:8"]) == "gpu"
    message = refusal(CLUSTER, [], ["-p", "small", "--gpus-per-node=a100:8"])
    assert "asks 8 a100 GPU(s) a node, and no node of partition 'small' has more than 4" in message
    assert "asks 1 h100 GPU(s)" in refusal(CLUSTER, [], ["--partition=small", "--gres=gpu:h100:1"])
    assert fits(SMALL, [], ["--gpus=16"]) == "debug"  # no node count: over the job's nodes
    assert refusal(SMALL, [], ["--gpus=17"]) == "--gpus=17 asks 17 GPUs, and partition 'debug' has 16"
    assert "--gpus=16 asks 16 GPU(s) a node" in refusal(SMALL, ["--nodes=1"], ["--gpus=16"])


def test_nodes_partitions_and_together():
    assert refusal(SMALL, ["--nodes=2"], ["-N", "3"]).startswith(
        "-N 3 asks 3 nodes of 1 CPU(s), and partition"
    )
    assert fits(CLUSTER, [], ["--nodes=18", "--mem=500G"]) == "gpu"
    assert "asks 17 nodes" in refusal(CLUSTER, [], ["--nodes=17-20", "--mem=600G"])  # 16 nodes hold 600G
    assert fits(CLUSTER, [], ["-p", "small,cpu", "--cpus-per-task=100"]) == "cpu"  # the first that can
    assert refusal(CLUSTER, [], ["-p", "big"]) == "no partition 'big'; sinfo lists cpu, gpu, small"
    mixed = "mixed* 1 64 8000 (null)\nmixed* 1 2 8000 gpu:8\n"
    assert fits(mixed, [], ["--cpus-per-task=64"]) == fits(mixed, [], ["--gpus-per-node=8"]) == "mixed"
    message = refusal(mixed, [], ["--cpus-per-task=64", "--gpus-per-node=8"])
    assert message == "no node of partition 'mixed' has 8 GPU(s) and 64 CPU(s) together; ask less of one"
    assert "no default partition" in refusal("a 1 2 8000 (null)\n", [])


# `sinfo -h -e -o '%P %D %c %m %G %l %t'` of the one-machine Slurm with a 1 h partition, a drained node
TIMED = "debug* 1 2 8000 gpu:8 1:00:00 idle\ndebug* 1 2 8000 gpu:8 1:00:00 drain\nlong 1 2 8000 gpu:8 infinite down*\n"


def test_time_over_the_partitions_limit_is_named_with_the_rest():
    groups, _ = parse_sinfo(TIMED)
    assert [g.max_time for g in groups] == [3600, 3600, None] and [g.usable for g in groups] == [
        True,
        False,
        False,
    ]
    assert fits(TIMED, [], ["--time=59:00"]) == "debug"
    message = refusal(TIMED, ["--time=24:00:00"], ["--mem=9G"])
    assert message == (
        "--mem=9G asks 9216 MB of memory a node, and no node of partition 'debug' has more than 8000, so it "
        "could never start; ask at most 8000 MB of memory; and #SBATCH --time=24:00:00 asks 24 h, over "
        "partition 'debug''s time limit of 1 h, so it would wait for good (PartitionTimeLimit); ask at most 1 h"
    )
    assert parse_time("2-12") == 2.5 * 86400 and parse_time("90") == 5400


def test_a_time_limit_within_the_warning_margin_is_refused():
    header = ["--signal=B:USR1@900", "--time=48:00:00"]
    assert fits(SMALL, header, ["--time=16:00"]) == "debug"
    assert refusal(SMALL, header, ["--time=10:00"]) == (
        "--time=10:00 (10 min) is not longer than the warning margin of #SBATCH --signal=B:USR1@900 (15 min): "
        "every run would be warned at once and stop; ask more time, or a smaller margin with "
        "--signal=B:USR1@SECONDS"
    )
    assert fits(SMALL, header, ["--time=10:00", "--signal=B:USR1@300"]) == "debug"


def test_drained_and_down_nodes_count_for_nothing():
    assert "-N 2 asks 2 nodes of 1 CPU(s), and partition 'debug' has 1" in refusal(TIMED, [], ["-N", "2"])
    assert refusal(TIMED, [], ["-p", "long"]) == (
        "every node of partition 'long' is out of service (down*); no job starts there"
    )
