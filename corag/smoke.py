"""`corag smoke`'s run: every stage small, with the configs the user will run, measured.

A smoke is a list of `Stage`s, each one or more `corag` commands run as subprocesses (one log a stage,
its own time limit), in order. A stage that fails is one line (the reason and its log); a stage that
needs a failed or skipped stage's output is skipped, naming it, and the others go on. Each command runs
under `probe`, which records at exit the process's peak host memory and, where CUDA was used, the
caching allocator's peak; a poller records each GPU's peak memory as `nvidia-smi` reports it while the
stage runs, and the stage's log gives the vLLM engine's own KV-cache figure. From the stage's outputs
come its rate: metered tokens a second per engine (sampling, evaluation, Search-R1), passages a second
encoded, trained tokens a second per GPU (SFT, GRPO) and, on a GPU of known peak, the MFU.

`write_report` writes `smoke.json` (what `corag plan --calibrate` reads) and `smoke.md` atomically.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from corag.config import load_yaml
from corag.data.jsonl import atomic_write, iter_jsonl
from corag.errors import InputError

# The program each stage command runs: `corag ARGS` under the probe (peak memory recorded at exit).
PROBE_PROGRAM = (
    "import sys; from corag.smoke import probe; probe(sys.argv[1]); del sys.argv[1]; "
    "from corag.cli import main; sys.exit(main(sys.argv[1:]))"
)
SMOKE_VERSION = 1
# The least time a stage gets while that much is left: starting Python, torch and a model takes about a
# minute on a busy CPU, whatever the stage's share.
MIN_STAGE_S = 120.0


def probe(path: str) -> None:
    """Record, when this process exits, its peak host memory (and its children's) and the CUDA caching
    allocator's peak over every device it used, as JSON in `path`."""
    import atexit
    import resource

    def record() -> None:
        peak = {
            "host_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "children_host_peak": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        }
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            peak["allocator_peak"] = max(
                torch.cuda.max_memory_allocated(d) for d in range(torch.cuda.device_count())
            )
        Path(path).write_text(json.dumps(peak))

    atexit.register(record)


@dataclass
class Command:
    """One subprocess of a stage: `corag ARGS` (under the probe) or any program, in the foreground, or in
    the background until the smoke ends (the retrieval service), ready when `ready` returns True."""

    args: list[str]
    corag: bool = True
    env: dict[str, str] = field(default_factory=dict)
    background: bool = False
    ready: Callable[[], bool] | None = None


@dataclass
class Stage:
    """A stage of the smoke: its commands, the stages whose outputs it needs, its share of the time,
    how its rate is read from its outputs, and the plan's memory figure for what it runs."""

    name: str
    commands: list[Command] = field(default_factory=list)
    needs: tuple[str, ...] = ()
    share: float = 0.1
    measure: Callable[[float], dict[str, float]] | None = None
    planned: float | None = None  # bytes: the fullest GPU's plan (on a CPU, the host's)
    skip: str | None = None  # why it does not run (the plan's reason)
    note: str = ""  # the variant it runs (LoRA, the transformers backend, ...)
    func: Callable[[], None] | None = None  # in-process work, after the commands


@dataclass
class StageResult:
    """What one stage did: ok, or its one-line reason; wall time; rates; memory measured and planned."""

    name: str
    status: str  # ok, failed, skipped
    reason: str = ""
    seconds: float = 0.0
    log: str = ""
    rates: dict[str, float] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)
    planned: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """Measured peak over the plan's figure (GPU memory on a GPU, host memory on a CPU)."""
        measured = self.memory.get("gpu_peak") or self.memory.get("host_peak")
        return measured / self.planned if measured and self.planned else None


class GpuPoller:
    """Each GPU's peak `memory.used` (bytes) while a stage runs, read from nvidia-smi twice a second."""

    def __init__(self) -> None:
        self.peaks: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuPoller:
        if shutil.which("nvidia-smi"):
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _poll(self) -> None:
        query = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            try:
                out = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                return
            for line in out.splitlines():
                index, _, used = line.partition(",")
                if index.strip().isdigit() and used.strip().isdigit():
                    i = int(index)
                    self.peaks[i] = max(self.peaks.get(i, 0.0), float(used) * 2**20)
            self._stop.wait(0.5)


# vLLM's own lines: "Available KV cache memory: 5.32 GiB", "GPU KV cache size: 41,520 tokens".
KV_MEMORY = re.compile(r"Available KV cache memory:\s*([0-9.]+)\s*GiB")
KV_TOKENS = re.compile(r"GPU KV cache size:\s*([0-9,]+)\s*tokens")


def kv_cache(log: Path) -> dict[str, float]:
    """The vLLM engine's KV-cache figures from a stage's log (the largest engine's), if it started one."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    found: dict[str, float] = {}
    if memory := [float(m) * 2**30 for m in KV_MEMORY.findall(text)]:
        found["kv_cache"] = max(memory)
    if tokens := [float(t.replace(",", "")) for t in KV_TOKENS.findall(text)]:
        found["kv_cache_tokens"] = max(tokens)
    return found


def last_lines(log: Path, pattern: str = r"error|Error|refused|Killed|No such") -> str:
    """The reason a command failed: its log's last line matching `pattern`, else its last line."""
    lines = (
        [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        if log.is_file()
        else []
    )
    for line in reversed(lines):
        if re.search(pattern, line):
            return line[:300]
    return lines[-1][:300] if lines else "no output"


def run_stage(stage: Stage, out: Path, limit: float, background: list[subprocess.Popen]) -> StageResult:
    """Run one stage's commands in order within `limit` seconds, its output in `out/logs/<name>.log`."""
    logs, probes = out / "logs", out / "probes"
    logs.mkdir(parents=True, exist_ok=True)
    probes.mkdir(parents=True, exist_ok=True)
    log = logs / f"{stage.name}.log"
    result = StageResult(stage.name, "ok", log=str(log), planned=stage.planned, note=stage.note)
    start = time.perf_counter()
    with GpuPoller() as poller, log.open("w") as sink:
        try:
            for i, command in enumerate(stage.commands):
                left = limit - (time.perf_counter() - start)
                if left <= 0:
                    raise TimeoutError
                _run_command(command, probes / f"{stage.name}-{i}.json", sink, left, background)
            if stage.func is not None:
                stage.func()
        except TimeoutError:
            result.status, result.reason = "failed", f"over its time limit of {limit:.0f} s"
        except subprocess.CalledProcessError as error:
            sink.flush()
            result.status = "failed"
            result.reason = f"exit status {error.returncode}: {last_lines(log)}"
        except Exception as error:  # an in-process stage: its one line
            result.status, result.reason = "failed", f"{type(error).__name__}: {' '.join(str(error).split())}"
    result.seconds = round(time.perf_counter() - start, 2)
    peaks = [json.loads(p.read_text()) for p in probes.glob(f"{stage.name}-*.json")]
    for key in ("host_peak", "allocator_peak"):
        if values := [p[key] for p in peaks if key in p]:
            result.memory[key] = max(values)
    if poller.peaks:
        result.memory["gpu_peak"] = max(poller.peaks.values())
    result.memory |= kv_cache(log)
    if result.status == "ok" and stage.measure is not None:
        try:
            result.rates = {k: round(v, 4) for k, v in stage.measure(result.seconds).items()}
        except (OSError, ValueError, KeyError) as error:
            result.reason = f"ran, but no rate: {type(error).__name__}: {error}"
    return result


def _run_command(
    command: Command, probe_file: Path, sink: Any, seconds: float, background: list[subprocess.Popen]
) -> None:
    args = (
        [sys.executable, "-c", PROBE_PROGRAM, str(probe_file), *command.args]
        if command.corag
        else command.args
    )
    sink.write(f"$ {' '.join(command.args if not command.corag else ['corag', *command.args])}\n")
    sink.flush()
    env = {**os.environ, **command.env}
    process = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.perf_counter() + seconds
    if command.background:
        background.append(process)
        while not (command.ready and command.ready()):
            if process.poll() is not None:
                raise subprocess.CalledProcessError(process.returncode, args)
            if time.perf_counter() > deadline:
                raise TimeoutError
            time.sleep(0.5)
        return
    try:
        status = process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        stop_process(process)
        raise TimeoutError from None
    if status != 0:
        raise subprocess.CalledProcessError(status, args)


def stop_process(process: subprocess.Popen) -> None:
    """End a stage's process and its children (its own session), TERM first, then KILL."""
    import signal

    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def run_smoke(
    stages: list[Stage],
    out: Path,
    minutes: float,
    echo: Callable[[str], None] = print,
    min_stage_s: float = MIN_STAGE_S,
) -> list[StageResult]:
    """Run the stages in order within `minutes`, each within its share of the time left; a stage whose
    needs did not run ok is skipped, naming them. Background processes (the service) end with the smoke."""
    results: dict[str, StageResult] = {}
    background: list[subprocess.Popen] = []
    end = time.perf_counter() + minutes * 60
    try:
        for i, stage in enumerate(stages):
            missing = [n for n in stage.needs if n in results and results[n].status != "ok"]
            if stage.skip is not None:
                result = StageResult(
                    stage.name, "skipped", stage.skip, planned=stage.planned, note=stage.note
                )
            elif missing:
                result = StageResult(
                    stage.name, "skipped", f"needs {', '.join(missing)}", planned=stage.planned
                )
            else:  # its share of the time left, at least min_stage_s of it; an early end leaves time to the rest
                remaining = end - time.perf_counter()
                left = max(
                    remaining * stage.share / sum(s.share for s in stages[i:]), min(min_stage_s, remaining)
                )
                if left < 1:
                    result = StageResult(
                        stage.name, "failed", f"no time left of the smoke's {minutes:g} minutes"
                    )
                else:
                    echo(f"== {stage.name} (at most {left:.0f} s)")
                    result = run_stage(stage, out, left, background)
            results[stage.name] = result
            echo(f"{stage.name}: {result.status}" + (f" ({result.reason})" if result.reason else "")
                 + (f"; log {result.log}" if result.status == "failed" else ""))  # fmt: skip
    finally:
        for process in background:
            stop_process(process)
    return list(results.values())


# Rates from the stages' outputs ---------------------------------------------------------------------


def sampled_rate(chains: Path, log: Path, engines: int) -> Callable[[float], dict[str, float]]:
    """Metered tokens a second per engine of a sampling run: its chains' tokens over the sampling time
    it reports (`sampling_seconds` in its summary; the stage's wall time where it reports none)."""

    def measure(seconds: float) -> dict[str, float]:
        tokens = sum(r.get("tokens", 0) for path in sorted(chains.parent.glob(chains.name))
                     for _, r in iter_jsonl(path))  # fmt: skip
        found = re.findall(r'"sampling_seconds":\s*([0-9.]+)', log.read_text(errors="replace"))
        took = sum(float(s) for s in found) or seconds
        return {"tokens": tokens, "tokens_per_s_per_engine": tokens / took / engines}

    return measure


def evaluated_rate(folder: Path) -> Callable[[float], dict[str, float]]:
    """Metered tokens a second per engine of an evaluation: each part's tokens over its own wall time
    (`parts/part-*/RUN/metrics.json`), or the merged runs' where there are no parts."""

    def measure(seconds: float) -> dict[str, float]:
        files = sorted(folder.glob("parts/*/*/metrics.json")) or sorted(folder.glob("*/metrics.json"))
        tokens, took = 0.0, 0.0
        for path in files:
            metrics = json.loads(path.read_text())
            tokens += metrics["tokens_per_question"] * metrics["count"]
            took += metrics["wall_seconds"]
        if not files:
            raise ValueError(f"no metrics.json under {folder}")
        return {"tokens": tokens, "tokens_per_s_per_engine": tokens / max(took, 1e-9)}

    return measure


def encoded_rate(index: Path, log: Path) -> Callable[[float], dict[str, float]]:
    """Passages a second encoded by one process: the index's rows over the encoding time `corag index`
    reports (its encoder loaded before), else over the stage's wall time."""

    def measure(seconds: float) -> dict[str, float]:
        rows = int(json.loads((index / "manifest.json").read_text())["corpus_size"])
        found = re.findall(r"encoding took ([0-9.]+) s", log.read_text(errors="replace"))
        return {
            "passages": rows,
            "passages_per_s_per_gpu": rows / max(float(found[-1]) if found else seconds, 1e-3),
        }

    return measure


def grpo_rate(output_dir: Path, gpus: int, chains_per_step: int) -> Callable[[float], dict[str, float]]:
    """Metered tokens a second per GPU of GRPO steps, rollouts and training together: each logged step's
    chains x `tokens_per_chain` over its `step_time` (the trainer's log)."""

    def measure(seconds: float) -> dict[str, float]:
        history = _history(output_dir)
        steps = [h for h in history if "step_time" in h and "tokens_per_chain" in h]
        if not steps:
            raise ValueError(f"no step_time in {output_dir}'s trainer log")
        tokens = sum(float(h["tokens_per_chain"]) * chains_per_step for h in steps)
        took = sum(float(h["step_time"]) for h in steps)
        return {
            "tokens": tokens,
            "step_s": took / len(steps),
            "grpo_tokens_per_s_per_gpu": tokens / took / gpus,
        }

    return measure


def _history(output_dir: Path) -> list[dict[str, Any]]:
    """The trainer's log of the last checkpoint under `output_dir`."""
    states = sorted(output_dir.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name[11:]))
    if not states:
        raise ValueError(f"no checkpoint-*/trainer_state.json under {output_dir}")
    return json.loads(states[-1].read_text())["log_history"]


def trained_rate(
    output_dir: Path, gpus: int, flops_per_token: float, peak: float | None
) -> Callable[[float], dict[str, float]]:
    """Trained tokens a second per GPU from the trainer's own log (`trainer_state.json`: trl's
    `num_tokens` over the steps' `train_runtime`, or the logged step times) and the MFU at `peak`."""

    def measure(seconds: float) -> dict[str, float]:
        history = _history(output_dir)
        tokens = max((float(h["num_tokens"]) for h in history if "num_tokens" in h), default=0.0)
        runtime = sum(float(h["train_runtime"]) for h in history if "train_runtime" in h) or seconds
        rates = {"tokens": tokens, "tokens_per_s_per_gpu": tokens / runtime / gpus}
        if peak:
            rates["mfu"] = rates["tokens_per_s_per_gpu"] * flops_per_token / peak
        return rates

    return measure


# The report -------------------------------------------------------------------------------------------


def _gb(value: float | None) -> str:
    return f"{value / 1e9:.1f}" if value else "-"


def _rate(rates: dict[str, float]) -> str:
    parts = []
    if "tokens_per_s_per_engine" in rates:
        parts.append(f"{rates['tokens_per_s_per_engine']:,.0f} tok/s/engine")
    if "passages_per_s_per_gpu" in rates:
        parts.append(f"{rates['passages_per_s_per_gpu']:,.0f} passages/s")
    if "tokens_per_s_per_gpu" in rates:
        parts.append(f"{rates['tokens_per_s_per_gpu']:,.0f} tok/s/GPU")
    if "grpo_tokens_per_s_per_gpu" in rates:
        parts.append(f"{rates['grpo_tokens_per_s_per_gpu']:,.0f} tok/s/GPU (steps: rollouts + training)")
    if "mfu" in rates:
        parts.append(f"MFU {rates['mfu']:.1%}")
    return ", ".join(parts) or "-"


def table(results: list[StageResult], gpu: bool) -> str:
    """The smoke's table (Markdown): stage, ok or the reason, wall time, rate, memory and the plan's."""
    where = "GPU" if gpu else "host"
    head = ["stage", "result", "wall s", "rate", f"{where} peak GB", "allocator peak GB", "KV cache GB",
            f"plan GB ({where})", "measured / plan"]  # fmt: skip
    rows = [head, ["---"] * len(head)]
    for r in results:
        status = "ok" if r.status == "ok" else f"{r.status}: {r.reason}"
        if r.note:
            status += f" ({r.note})"
        measured = r.memory.get("gpu_peak" if gpu else "host_peak")
        rows.append([
            r.name, status, f"{r.seconds:.1f}" if r.status != "skipped" else "-", _rate(r.rates),
            _gb(measured), _gb(r.memory.get("allocator_peak")), _gb(r.memory.get("kv_cache")), _gb(r.planned),
            f"{r.ratio:.2f}" if r.ratio else "-",
        ])  # fmt: skip
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def write_report(out: Path, results: list[StageResult], meta: dict[str, Any]) -> tuple[Path, Path]:
    """`smoke.json` (every figure, and what was run: configs, models, devices) and `smoke.md` (the
    table), each written whole or not at all."""
    gpu = bool(meta.get("gpus"))
    record = {"version": SMOKE_VERSION, **meta, "stages": [asdict(r) | {"ratio": r.ratio} for r in results]}
    md = f"# corag smoke\n\n{meta.get('describe', '')}\n\n{table(results, gpu)}\n"
    with atomic_write(out / "smoke.json") as f:
        json.dump(record, f, indent=2)
    with atomic_write(out / "smoke.md") as f:
        f.write(md)
    return out / "smoke.json", out / "smoke.md"


def memory_flags(stages: list[dict[str, Any]]) -> str | None:
    """One line naming every stage whose measured peak passed the plan's figure by more than 10%."""
    over = [f"{s['name']} {s['ratio']:.2f}x" for s in stages if s.get("ratio") and s["ratio"] > 1.1]
    return f"memory over plan by more than 10%: {', '.join(over)} (measured peak / planned)" if over else None


def config_digest(path: Path) -> str:
    """A config's identity for `corag plan --calibrate`: the hash of its text and of the bases it reads."""
    import hashlib

    digest = hashlib.sha256()
    while True:
        digest.update(path.read_bytes())
        base = load_yaml(path).get("base")
        if not base:
            return digest.hexdigest()
        path = (path.parent / str(base)).resolve()


def read_smoke(smoke_json: str, config_file: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The smoke stage that ran `config_file`, its measured figures and the smoke's record; a file that
    is not a smoke's, or a smoke of other configs, refused in one line."""
    try:
        record = json.loads(Path(smoke_json).read_text())
        configs, stages = record["configs"], {s["name"]: s for s in record["stages"]}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InputError(f"not a smoke.json of `corag smoke` ({type(error).__name__})", file=smoke_json,
                         field="--calibrate") from None  # fmt: skip
    digest = config_digest(Path(config_file).resolve())
    for stage, config in configs.items():
        if config.get("sha256") == digest:
            result = stages.get(stage)
            if result is None or result.get("status") != "ok":
                why = result.get("reason") if result else "not run"
                raise InputError(
                    f"the smoke's {stage} stage did not run ok ({why})", file=smoke_json, field="--calibrate"
                )
            return stage, result, record
    ran = ", ".join(f"{Path(c['path']).name} ({stage})" for stage, c in configs.items())
    raise InputError(
        f"measured other configs ({ran}), not {config_file} as it is now: run `corag smoke` with it first",
        file=smoke_json,
        field="--calibrate",
    )
