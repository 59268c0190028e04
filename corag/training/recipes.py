"""What the training recipes (corag/recipes/: sft, grpo) share: a bad setting as one line, W&B offline
where it cannot log, attention that can run here, a checkpoint and a stop on Slurm's warning before the
time limit, and a clean end of a run over several processes.

Importing this module makes bad input one line in every recipe process: an InputError that nothing
caught (a file found wrong after parsing, on any rank under `accelerate launch`) ends the process as
`fail` does, not with a traceback in the rank's log; CORAG_DEBUG=1, as for the `corag` command, keeps
the traceback.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn
from urllib.parse import urlparse

import torch
from transformers import TrainerCallback

from corag.cluster.stop import STOPPED, StopRequest, stopped
from corag.errors import InputError

logger = logging.getLogger("corag.training")


def fail(message: str, prog: str) -> NoReturn:
    """A bad config or flag of the recipe `prog`: one line on stderr, exit status 2 (as argparse does)."""
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(2)


_previous_hook = sys.excepthook


def _uncaught(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
    """sys.excepthook of a recipe process: an uncaught InputError is `fail`'s one line, from `corag train
    NAME` as the recipe's own (NAME: the file that runs, recipes/sft.py or -m corag.recipes.sft), and exit
    status 2 (Python exits with the status of a SystemExit raised here); the rest goes to the previous hook."""
    if issubclass(kind, InputError) and os.environ.get("CORAG_DEBUG", "") in ("", "0"):
        fail(str(error), f"corag train {Path(sys.argv[0]).stem}")
    _previous_hook(kind, error, trace)


sys.excepthook = _uncaught


def wandb_offline_if_unreachable(
    report_to: str | list[str] | None,
    env: MutableMapping[str, str],
    reachable: Callable[[str], bool] | None = None,
) -> str | None:
    """Switch W&B to offline (WANDB_MODE=offline in `env`) when it is asked for but has no API key or no
    network, so a node without either trains instead of failing in the trainer; returns the warning.

    `wandb sync` uploads the offline run later. A run that says WANDB_MODE itself is left alone.
    """
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if not ({"wandb", "all"} & set(names)) or env.get("WANDB_MODE", "").lower() in (
        "offline",
        "disabled",
        "dryrun",
    ):
        return None
    base = env.get("WANDB_BASE_URL", "https://api.wandb.ai")
    host = urlparse(base).hostname or "api.wandb.ai"
    if not env.get("WANDB_API_KEY") and not _netrc_has(host, env):
        reason = "no W&B API key (set WANDB_API_KEY or run `wandb login`)"
    elif not (reachable or _reachable)(base):
        reason = f"{base} cannot be reached"
    else:
        return None
    env["WANDB_MODE"] = "offline"
    return f"{reason}: W&B logs offline into ./wandb (upload later with `wandb sync`)"


def _netrc_has(host: str, env: Mapping[str, str]) -> bool:
    """Whether the netrc file `wandb login` writes holds a password for `host`."""
    import netrc

    path = env.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def _reachable(url: str, timeout: float = 5.0) -> bool:
    """Whether a TCP connection to the URL's host opens within `timeout` seconds."""
    import socket

    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname or "", port), timeout=timeout).close()
    except OSError:
        return False
    return True


def attention_implementation(requested: str | None) -> str | None:
    """The requested attention, or sdpa where a flash-attention kernel cannot run (no GPU, not installed).

    Padding-free batches need attention that reads sequence boundaries from position_ids: flash attention
    does it in varlen kernels; sdpa does it with a block-diagonal mask (correct, slower: the CPU fallback).
    """
    kernels = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}
    if requested in kernels and not (
        torch.cuda.is_available() and importlib.util.find_spec(kernels[requested]) is not None
    ):
        logger.warning("%s cannot run here (no GPU or no %s); using sdpa", requested, kernels[requested])
        return "sdpa"
    return requested


class StopOnWarning(TrainerCallback):
    """On Slurm's warning before the time limit (SIGUSR1, corag.cluster.stop): save a checkpoint at the end of the
    step in hand and stop training; `stopped` then says so. The processes decide together (the flag is
    reduced over them after every step), so none waits in a collective that another has left."""

    def __init__(self) -> None:
        self.request = StopRequest().install()
        self.stopped = False

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001 (transformers' callback signature)
        # transformers takes one step before it checks max_steps: a run resumed at its last step (warned
        # there, then requeued) would train past it. It ends here instead, before the step; see `train`.
        if 0 < state.max_steps <= state.global_step:
            raise AtMaxSteps(state.global_step)
        return control

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 (transformers' callback signature)
        if self._anywhere(self.request.received, args.device):
            logger.info(
                "the time limit is near: saving a checkpoint after step %d and stopping", state.global_step
            )
            control.should_save = True
            control.should_training_stop = True
            self.stopped = True
        return control

    @staticmethod
    def _anywhere(flag: bool, device: torch.device) -> bool:
        """Whether any process of the run has the flag (this one's alone without a process group)."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return flag
        value = torch.tensor([int(flag)], device=device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return bool(value.item())


class AtMaxSteps(Exception):
    """A resumed run is at (or past) its max_steps before any step (StopOnWarning.on_step_begin)."""


def train(trainer: Any, checkpoint: str | None) -> Any:
    """`trainer.train(resume_from_checkpoint=checkpoint)`, except that a run resumed at its last step
    trains no further: the checkpoint's model and state are loaded, and the recipe only saves them."""
    from transformers.trainer_utils import TrainOutput

    try:
        return trainer.train(resume_from_checkpoint=checkpoint)
    except AtMaxSteps as at:
        logger.info(
            "resumed at step %s, its max_steps %s: no further step, only the final save",
            at.args[0],
            trainer.state.max_steps,
        )
        return TrainOutput(trainer.state.global_step, 0.0, {"global_step": trainer.state.global_step})


def leave(code: int) -> NoReturn:
    """End a recipe process with `code`, every file flushed, without the interpreter's teardown where a
    process group was used: at exit the DDP reducer's Gloo group joins a worker thread that waits for the
    GIL the exiting main thread holds, and the process never ends (seen on a two-node Slurm job; pytorch
    issues 75097 and 190489). Everything the run writes is closed by then."""
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if distributed:
        os._exit(code)
    sys.exit(code)


def end_stopped(trainer: Any) -> int:
    """End a run that StopOnWarning stopped: its checkpoint is written; the first process says so (one line,
    the requeue mark). The exit status: 75, or 0 under torchelastic (`accelerate launch` on several
    processes), which reports a worker's non-zero status as a failure; the mark says it there."""
    where = f"step {trainer.state.global_step} (checkpoint in {trainer.args.output_dir})"
    code = stopped(where) if trainer.accelerator.is_main_process else STOPPED
    close_processes(trainer)
    return 0 if "TORCHELASTIC_RUN_ID" in os.environ else code


def close_processes(trainer: Any) -> None:
    """The run's last collective: every process waits for the others, then leaves the process group, so a
    node that finishes first does not tear down what the others still use."""
    trainer.accelerator.wait_for_everyone()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
