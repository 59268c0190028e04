"""A retrieval service for a job's engines: started, waited for, published in a URL file, stopped.

    python -m corag.cluster.node_service INDEX URL_FILE [--remote] [--port P] [--wait-minutes 30]
                                          [--log FILE] [-- flags for corag serve-retriever]

It runs `corag serve-retriever INDEX` (a dense index's fp16 shards over every GPU this process sees, or
the CPU), waits until the service answers GET /health, writes its URL to URL_FILE, and stays until the
service ends or this process is stopped (SIGTERM, scancel); URL_FILE is removed then. By default it
serves this node's own jobs, on loopback and a free port (the layout of the shipped sampling and
evaluation configs: one service per node, its shards beside the engines); `--remote` serves other nodes
(every interface, port 8000 unless --port, the URL under this host's name or $CORAG_SERVICE_HOST).

The launchers start it for you: `sampling/slurm_array.sh ... --serve-index INDEX` and
`evaluation/slurm_eval.sh ... --serve-index INDEX`; `sampling/serve_retriever.sh` runs it with --remote.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from corag.config import parse_config
from corag.data.jsonl import atomic_write
from corag.errors import InputError
from corag.retrieval.client import answers_health


@dataclass
class NodeServiceArgs:
    index: str = field(metadata={"positional": True, "help": "index folder written by `corag index`"})
    url_file: str = field(metadata={"positional": True, "help": "where the service's URL is written"})
    remote: bool = field(
        default=False, metadata={"help": "serve other nodes: every interface, the URL under this host's name"}
    )
    port: int | None = field(default=None, metadata={"help": "default: a free port (8000 with --remote)"})
    wait_minutes: float = field(default=30.0, metadata={"help": "how long the index may take to load"})
    log: str | None = field(default=None, metadata={"help": "the service's log (default: this output)"})


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
    command = [sys.executable, "-m", "corag.cli", "serve-retriever", index, *host, "--port", str(port)]
    command += flags
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


def main(argv: list[str] | None = None) -> int:
    own = list(sys.argv[1:] if argv is None else argv)
    flags: list[str] = []
    if "--" in own:
        own, flags = own[: own.index("--")], own[own.index("--") + 1 :]
    args = parse_config(NodeServiceArgs, own, __doc__.splitlines()[0])
    url_file = Path(args.url_file)
    # scancel and `kill` send SIGTERM: leave through the finally blocks (service stopped, file removed)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    port = args.port or (8000 if args.remote else free_port())
    with node_service(args.index, args.log, args.wait_minutes * 60, args.remote, port, flags) as url:
        try:
            with atomic_write(url_file) as f:
                f.write(url + "\n")
            print(f"retrieval service of {args.index} at {url} (written to {url_file})", flush=True)
            while answers_health(f"http://127.0.0.1:{port}", timeout=30):
                time.sleep(10)
            print(f"the retrieval service at {url} stopped answering", file=sys.stderr)
            return 1
        finally:
            url_file.unlink(missing_ok=True)


if __name__ == "__main__":
    from corag.cli import run_command

    sys.exit(run_command("node_service", main, sys.argv[1:]))
