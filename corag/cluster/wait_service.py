"""Wait for a retrieval service job's URL file and print the URL (for launchers written in shell).

    python -m corag.cluster.wait_service URL_FILE [--wait-minutes 30] [--service-pid PID]

The URL is printed on stdout once the file exists and the service answers GET /health; after
`--wait-minutes` without one, a one-line error naming the file and exit status 2.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from corag.config import parse_config
from corag.retrieval.client import wait_for_service


@dataclass
class WaitArgs:
    url_file: str = field(
        metadata={"positional": True, "help": "the file sampling/serve_retriever.sh writes its URL to"}
    )
    wait_minutes: float = field(default=30.0, metadata={"help": "how long to wait at most"})
    service_pid: int | None = field(
        default=None, metadata={"help": "the service's process (this job's own): stop waiting if it exits"}
    )


def running(pid: int) -> bool:
    """Whether process `pid` runs (exists and has not exited: a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def main(argv: list[str] | None = None) -> int:
    args = parse_config(WaitArgs, sys.argv[1:] if argv is None else argv, __doc__.splitlines()[0])
    alive = None
    if args.service_pid is not None:
        alive = lambda: running(args.service_pid)  # noqa: E731
    print(wait_for_service(args.url_file, args.wait_minutes * 60, alive=alive))
    return 0


if __name__ == "__main__":
    from corag.cli import run_command

    sys.exit(run_command("wait_service", main, sys.argv[1:]))
