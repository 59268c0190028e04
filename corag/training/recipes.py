"""What the training recipes (corag/recipes/: sft, grpo) share: their prologue (device flags, the run's
start, resume, tokenizer and model load) and final save, a bad setting as one line, W&B offline where it
cannot log, attention that can run here, a time limit, a checkpoint and a stop on Slurm's warning before
the time limit, a clean end of a run over several processes, and the check of every private trl name the
trainers rely on (one tested trl version).

Importing this module makes bad input one line in every recipe process: an InputError that nothing
caught (a file found wrong after parsing, on any rank under `accelerate launch`) ends the process as
`fail` does, not with a traceback in the rank's log; CORAG_DEBUG=1, as for the `corag` command, keeps
the traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import resource
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn
from urllib.parse import urlparse

import torch
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback, set_seed
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import is_torch_bf16_gpu_available

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

TESTED_TRL = "1.16"
# What the recipes take from trl beyond its public API: (module, class or None) -> names. The GRPO trainer
# overrides and reads GRPOTrainer's internals and syncs vLLM by VLLMGeneration's; the SFT recipe switches
# trl's fused LM head with `_use_triton` (corag.recipes.sft.score_only_labelled_positions).
PRIVATE_NAMES: dict[tuple[str, str | None], tuple[str, ...]] = {
    ("trl.trainer.grpo_trainer", "GRPOTrainer"): (
        "_generate_and_score_completions",
        "_prepare_inputs",
        "_get_per_token_logps_and_entropies",
        "_compute_loss",
    ),
    ("trl.generation.vllm_generation", "VLLMGeneration"): ("_iter_named_params", "sync_weights"),
    ("trl.trainer.utils", None): (
        "pad",
        "split_tensor_dict",
        "use_adapter",
        "_use_triton",
        "add_fused_lm_head",
    ),
    ("trl.models.utils", None): ("disable_gradient_checkpointing",),
}
# Attributes a GRPOTrainer instance sets in __init__ that the chain trainer reads (the second with vLLM).
INSTANCE_NAMES = ("_metrics", "_step", "_buffered_inputs", "chat_template_kwargs")
VLLM_INSTANCE_NAMES = ("_last_loaded_step", "vllm_generation")


class TrlVersionError(ImportError):
    """The installed trl lacks a private name a recipe relies on."""


def trl_version_error(where: str) -> TrlVersionError:
    return TrlVersionError(
        f"trl {trl.__version__} has no {where}, which corag's recipes rely on; it is tested with trl "
        f"{TESTED_TRL}.x (pip install 'trl>={TESTED_TRL},<1.17')"
    )


def defined_by_trl(owner: Any, name: str) -> bool:
    """Whether trl itself defines `name` on the module or class `owner` (a class's name inherited from
    transformers' Trainer is not trl's)."""
    if not isinstance(owner, type):
        return hasattr(owner, name)
    return any(name in vars(k) for k in owner.__mro__ if k.__module__.startswith("trl."))


def check_trl(names: Mapping[tuple[str, str | None], Sequence[str]] = PRIVATE_NAMES) -> None:
    """Every private trl name the recipes rely on is there, or one line naming the installed and the
    tested trl version."""
    for (module, owner_name), attributes in names.items():
        try:
            owner: Any = importlib.import_module(module)
            owner = getattr(owner, owner_name) if owner_name else owner
        except (ImportError, AttributeError):
            owner = None
        missing = [a for a in attributes if owner is None or not defined_by_trl(owner, a)]
        if missing:
            raise trl_version_error(".".join(part for part in (module, owner_name, missing[0]) if part))


def check_instance(trainer: Any, names: Sequence[str]) -> None:
    """The instance attributes of a trl trainer the recipe reads, or one line as check_trl's."""
    missing = [name for name in names if not hasattr(trainer, name)]
    if missing:
        raise trl_version_error(f"attribute {missing[0]} on {type(trainer).__mro__[1].__name__}")


# -- the recipes' prologue and final save ---------------------------------------------------------------


def device_flags(argv: list[str]) -> list[str]:
    """`argv` with bf16 off where the device lacks it (configs written for GPUs also run, in fp32, on CPU),
    and `--use_cpu true` without a GPU where it matters: several processes (DDP over gloo needs it, else
    each process trains alone) or bf16 asked for on a CPU (autocast needs it). The command line's own
    `--bf16` or `--use_cpu` is kept."""
    argv = list(argv)
    if not is_torch_bf16_gpu_available() and "--bf16" not in argv:
        logger.warning("bf16 is not available on this device; training in fp32")
        argv += ["--bf16", "false"]
    bf16_on_cpu = "--bf16" in argv and argv[argv.index("--bf16") + 1 :][:1] == ["true"]
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if (several or bf16_on_cpu) and not torch.cuda.is_available() and "--use_cpu" not in argv:
        argv += ["--use_cpu", "true"]
    return argv


def start_run(args: Any) -> None:
    """Logging (the first process at INFO), the seed, and W&B offline where it cannot log (before the
    trainer starts it)."""
    logging.basicConfig(level=logging.INFO if args.process_index == 0 else logging.WARNING)
    set_seed(args.seed)
    warning = wandb_offline_if_unreachable(args.report_to, os.environ)
    if warning and args.process_index == 0:
        logger.warning(warning)


def resume_checkpoint(args: Any) -> str | None:
    """The checkpoint to resume from: the one given, else the last in output_dir (a requeued job goes on
    where it stopped)."""
    checkpoint = args.resume_from_checkpoint
    if checkpoint is None and os.path.isdir(args.output_dir):
        checkpoint = get_last_checkpoint(args.output_dir)
    if checkpoint:
        logger.info("resuming from %s", checkpoint)
    return checkpoint


DTYPES = {
    "auto": "auto",
    None: None,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}


def load_tokenizer(model_args: Any, trust_remote_code: bool = False) -> Any:
    """The model's tokenizer (its chat template renders every example, as at inference), padding with
    the end token where it has no pad token."""
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path, revision=model_args.model_revision, trust_remote_code=trust_remote_code
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(model_args: Any, trust_remote_code: bool = False) -> Any:
    """The model in the config's dtype (trl's ModelConfig: auto, bfloat16, float16 or float32) and attention."""
    return AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        dtype=DTYPES[model_args.dtype],
        attn_implementation=model_args.attn_implementation,
        trust_remote_code=trust_remote_code,
    )


def save_final(trainer: Any, result: Any, tokenizer: Any, output_dir: str) -> None:
    """A finished run's metrics and trainer state, then a model AutoModelForCausalLM loads (a LoRA adapter
    with use_peft) and its tokenizer."""
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    trainer.save_model(output_dir)
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(output_dir)


@dataclass
class TimeLimitArguments:
    """A limit on a run's training time (the benchmarks give runs equal compute by it)."""

    time_limit_minutes: float | None = field(
        default=None,
        metadata={"help": "stop (and save) after the step that passes this many minutes of training"},
    )
    time_limit_clock: str = field(
        default="wall",
        metadata={
            "help": "what the time limit counts: wall (minutes on the clock) or cpu (the process's CPU "
            "minutes over its torch threads: wall time on an idle machine, unshortened by other load)"
        },
    )

    def check(self) -> None:
        if self.time_limit_clock not in TimeLimit.CLOCKS:
            raise InputError(f"wall or cpu, not {self.time_limit_clock!r}", field="time_limit_clock")

    def callbacks(self) -> list[TrainerCallback]:
        """The TimeLimit callback when a limit is set."""
        if self.time_limit_minutes is None:
            return []
        return [TimeLimit(self.time_limit_minutes, self.time_limit_clock)]


def compute_seconds() -> float:
    """CPU seconds of this process and its finished children over torch's thread count: the wall time the
    work would take on an idle machine, whatever else the machine runs meanwhile."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    busy = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    return busy / torch.get_num_threads()


class TimeLimit(TrainerCallback):
    """Ends training after the step during which `minutes` passed on the clock (`wall`, or `cpu`: see
    compute_seconds); the model is saved."""

    CLOCKS = {"wall": time.monotonic, "cpu": compute_seconds}

    def __init__(self, minutes: float, clock: str = "wall") -> None:
        self.now = self.CLOCKS[clock]
        self.seconds, self.start = minutes * 60, self.now()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 (transformers' callback signature)
        if self.now() - self.start >= self.seconds:
            logger.info("time limit reached after step %d", state.global_step)
            control.should_training_stop = True
        return control


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
