"""Submit a batch script with sbatch once some node of its partition can run it.

usage: corag submit SCRIPT [SBATCH_FLAGS ...] [-- SCRIPT_ARGS ...]

    corag submit recipes/slurm_train.sh --nodes=2 --cpus-per-task=32 --mem=400G --wait -- \\
        sft zero3 configs/sft/llama3.1-8b-full.yaml

What the script's #SBATCH lines and the flags (which override them) ask of a node (--cpus-per-task,
--ntasks-per-node, --mem, --mem-per-cpu, --gpus-per-node, --gres, --gpus, --nodes, --partition) is
checked against the nodes `sinfo` lists for the partition (the default one unless --partition), and
--time against the partition's time limit (and against the --signal=B:USR1@SECONDS warning margin). A
job no node in service can ever run is refused in one line naming every option no node meets (sbatch
would queue it, and it would wait for good: Reason=PartitionConfig or PartitionTimeLimit); otherwise
`sbatch SBATCH_FLAGS SCRIPT SCRIPT_ARGS` runs, and its exit status is this command's. Options it does not
size by (--wait, --array, --test-only, ...) go to sbatch as given.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from corag.cluster.submit import check, header_options, node_groups, parse_request
from corag.errors import InputError

USAGE = __doc__.split("\n\n")[1]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.split("\n\n", 1)[1], end="")
        raise SystemExit(0)
    if not argv or argv[0].startswith("-"):
        raise InputError(f"the batch script comes first ({USAGE})")
    script, rest = argv[0], argv[1:]
    flags, script_args = (
        (rest[: rest.index("--")], rest[rest.index("--") + 1 :]) if "--" in rest else (rest, [])
    )
    if not Path(script).is_file():
        raise InputError("no such batch script", file=script)
    groups, default = node_groups()
    try:
        partition = check(parse_request(header_options(Path(script).read_text()), flags), groups, default)
    except InputError as e:
        raise InputError(str(e), file=script) from None
    print(f"corag submit: partition {partition!r} has nodes that can run {script}", file=sys.stderr)
    return subprocess.run(["sbatch", *flags, script, *script_args], check=False).returncode


if __name__ == "__main__":
    from corag.cli import run_command

    sys.exit(run_command("submit", main, sys.argv[1:]))
