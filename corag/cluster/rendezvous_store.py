"""The rendezvous store of a training job over several nodes, hosted by the job's batch shell
(recipes/slurm_train.sh) on the first node, where Slurm runs it:

    python -m corag.cluster.rendezvous_store PORT $$ &

Every node's `accelerate launch` (python -m corag.cluster.accelerate_join) only connects to it (c10d
rendezvous, is_host=0). Hosted by one of them, the store ends when that node's launcher exits, and a node
that finishes a moment later fails its rendezvous heartbeat and shutdown with errors in its log (seen on
a real Slurm); the batch shell outlives every node. It ends with the batch shell (the
process PARENT, `$$`; exec keeps its pid).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not all(a.isdigit() for a in args):
        print("usage: python -m corag.cluster.rendezvous_store PORT PARENT", file=sys.stderr)
        return 2
    port, parent = int(args[0]), int(args[1])
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # the warning before the time limit is not for the store
    from torch.distributed import TCPStore

    store = TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False, timeout=timedelta(hours=1))
    while os.getppid() == parent:
        time.sleep(1)
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
