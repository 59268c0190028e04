"""`accelerate launch` on a node that joins a rendezvous store hosted by another process
(recipes/slurm_train.sh over several nodes):

    python -m corag.cluster.accelerate_join ACCELERATE launch [accelerate launch flags] SCRIPT [ARGS]

ACCELERATE is the accelerate command (a name on PATH or a path); it runs in this process as it would
alone, except for one check: accelerate refuses to start machine 0 while its rendezvous port is in use
there, taking machine 0's launcher to host the store. Under recipes/slurm_train.sh the job's batch shell
hosts it on the first node (python -m corag.cluster.rendezvous_store) and every node only connects to
it (`--rdzv_conf is_host=0`): a store hosted by machine 0's launcher ends with that launcher, and a node
that leaves a moment later fails its rendezvous heartbeat and shutdown on it, with errors in its log.
"""

from __future__ import annotations

import runpy
import shutil
import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print("usage: python -m corag.cluster.accelerate_join ACCELERATE launch [ARGS ...]", file=sys.stderr)
        return 2
    command = shutil.which(args[0]) or args[0]
    try:
        import accelerate.utils.launch as launch_utils
    except ImportError:
        pass  # not this Python's accelerate: nothing to relax
    else:
        launch_utils.is_port_in_use = lambda port=None: False  # the store's port, taken by the batch shell
    sys.argv = [command, *args[1:]]
    try:
        runpy.run_path(command, run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
