"""corag.smoke and `corag plan --calibrate`: measured rates replace the assumed ones (figures by hand),
the memory flag, and a smoke.json of other configs refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

from corag.cli import main as cli
from corag.resources import CONFIGS
from corag.smoke import config_digest, memory_flags

SAMPLING = CONFIGS / "sampling" / "llama3.1-8b.yaml"
SFT = CONFIGS / "sft" / "llama3.1-8b-full.yaml"


def smoke_json(path: Path, configs: dict[str, Path], stages: list[dict]) -> str:
    """A smoke.json as `corag smoke` writes it, with figures chosen for the arithmetic below."""
    record = {
        "version": 1,
        "device": "NVIDIA H100 80GB HBM3",
        "gpus": 8,
        "configs": {
            s: {"path": str(p), "sha256": config_digest(p), "model": "m"} for s, p in configs.items()
        },
        "stages": [{"status": "ok", "seconds": 60.0, "rates": {}, "ratio": None, **s} for s in stages],
    }
    path.write_text(json.dumps(record))
    return str(path)


def plan(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli(["plan", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_measured_rates_replace_the_assumed_ones(tmp_path: Path, capsys) -> None:
    measured = smoke_json(tmp_path / "smoke.json", {"sample": SAMPLING, "sft": SFT}, [
        {"name": "sample", "rates": {"tokens_per_s_per_engine": 12_000.0}},
        {"name": "sft", "rates": {"tokens_per_s_per_gpu": 3_000.0, "mfu": 0.45}},
    ])  # fmt: skip
    # Sampling: 125,385 questions x 16 chains x 3 steps x (1,142.5 + 300) tokens = 8,681,657,400 tokens
    # over 8 GPUs at 12,000 tokens/s each: 90,434 s = 25.1 h (at the assumed ~5,000: 60.3 h).
    _, before, _ = plan(capsys, "--config", str(SAMPLING))
    status, out, _ = plan(capsys, "--config", str(SAMPLING), "--calibrate", measured)
    assert status == 0 and "wall time over the job's limit: 60.3 h on 1 node(s)" in before
    assert "25.1 h on 1 node(s)" in out
    assert "measured: 12,000 metered tokens/s per engine (corag smoke on NVIDIA H100 80GB HBM3" in out
    assert "in place of the assumed 5,000" in out and "are assumed" in out
    # SFT: 125,385 chains x (3,000 + 0.2 x 3 x 1,142.5) = 462,106,418 tokens at 3,000 a GPU over 8: 5.3 h.
    status, out, _ = plan(capsys, "--config", str(SFT), "--calibrate", measured)
    assert status == 0 and "wall time: 5.3 h on 1 node(s)" in out
    assert "measured: MFU 45.0% in place of the assumed 30%" in out
    # a stage the smoke measured no rate for keeps the assumption, and says so
    bare = smoke_json(tmp_path / "bare.json", {"sample": SAMPLING}, [{"name": "sample"}])
    status, out, _ = plan(capsys, "--config", str(SAMPLING), "--calibrate", bare)
    assert "60.3 h" in out and "assumed: metered tokens/s per engine (the smoke measured none)" in out


def test_a_stage_over_its_planned_memory_by_more_than_ten_percent_is_named(tmp_path: Path, capsys) -> None:
    stages = [
        {"name": "sample", "ratio": 1.05},
        {"name": "grpo", "ratio": 1.16},
        {"name": "sft", "ratio": 0.4},
    ]
    assert memory_flags(stages) == "memory over plan by more than 10%: grpo 1.16x (measured peak / planned)"
    assert memory_flags(stages[:1] + stages[2:]) is None
    measured = smoke_json(tmp_path / "smoke.json", {"sample": SAMPLING}, stages)
    _, out, _ = plan(capsys, "--config", str(SAMPLING), "--calibrate", measured)
    assert [ln for ln in out.splitlines() if "memory over plan" in ln] == [memory_flags(stages)]


def test_a_smoke_of_other_configs_or_not_a_smoke_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    other = smoke_json(tmp_path / "smoke.json", {"sft": SFT}, [{"name": "sft"}])
    status, out, err = plan(capsys, "--config", str(SAMPLING), "--calibrate", other)
    assert status == 2 and out == "" and err.count("\n") == 1
    assert "measured other configs (llama3.1-8b-full.yaml (sft)), not" in err
    # the same file name with other settings is another config
    edited = tmp_path / "llama3.1-8b.yaml"
    edited.write_text(SAMPLING.read_text().replace("num_chains: 16", "num_chains: 8"))
    same = smoke_json(tmp_path / "same.json", {"sample": SAMPLING}, [{"name": "sample"}])
    status, out, err = plan(capsys, "--config", str(edited), "--calibrate", same)
    assert status == 2 and "measured other configs" in err and err.count("\n") == 1
    (tmp_path / "notes.json").write_text("[1, 2]")
    status, out, err = plan(capsys, "--config", str(SAMPLING), "--calibrate", str(tmp_path / "notes.json"))
    assert status == 2 and out == "" and "not a smoke.json of `corag smoke`" in err and err.count("\n") == 1
    failed = smoke_json(tmp_path / "failed.json", {"sample": SAMPLING}, [
        {"name": "sample", "status": "failed", "reason": "exit status 1: CUDA out of memory"}])  # fmt: skip
    status, out, err = plan(capsys, "--config", str(SAMPLING), "--calibrate", failed)
    assert status == 2 and "did not run ok (exit status 1: CUDA out of memory)" in err


def test_encoding_time_is_in_the_plan_of_the_service(tmp_path: Path, capsys) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("# hardware: 1 node x 8 GPUs x 80 GB\nindex: data/index/e5-large-v2\n")
    # the KILT corpus's 35.7M passages at 2,000 a second on each of 8 GPUs: 2,231 s = 0.6 h; on 2 nodes 0.3 h
    status, out, _ = plan(capsys, "--config", str(config))
    assert status == 0 and "wall time: 0.6 h on 1 node(s)" in out
    assert "encoding the index: 35,700,000 passages" in out
    _, out, _ = plan(capsys, "--config", str(config), "--nodes", "2")
    assert "wall time: 0.3 h on 2 node(s)" in out


def test_a_stage_over_its_time_limit_or_failing_is_one_line_and_its_dependents_are_skipped(
    tmp_path: Path,
) -> None:
    import sys

    from corag.smoke import Command, Stage, run_smoke

    def python(code: str) -> Command:
        return Command([sys.executable, "-c", code], corag=False)

    stages = [
        Stage("slow", [python("import time; time.sleep(60)")], share=0.1),
        Stage("after-slow", [python("pass")], needs=("slow",)),
        Stage("broken", [python("import sys; print('working'); print('error: no such model', file=sys.stderr); sys.exit(3)")]),
        Stage("fine", [python("print('done')")]),
    ]  # fmt: skip
    lines: list[str] = []
    results = {r.name: r for r in run_smoke(stages, tmp_path, minutes=0.5, echo=lines.append, min_stage_s=0)}
    assert results["slow"].status == "failed" and results["slow"].reason.startswith("over its time limit of")
    assert results["slow"].seconds < 20  # ended at its limit (30 s x 0.1 / 0.4), not after the minute asked
    assert (results["after-slow"].status, results["after-slow"].reason) == ("skipped", "needs slow")
    assert results["broken"].reason == "exit status 3: error: no such model"
    assert results["fine"].status == "ok"
    assert (
        f"broken: failed (exit status 3: error: no such model); log {tmp_path / 'logs' / 'broken.log'}"
        in lines
    )
