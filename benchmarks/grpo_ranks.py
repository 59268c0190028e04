"""GRPO on 2 CPU processes (gloo): forwards of the old-policy / reference pass per step and step time.

The toy world's GRPO (configs/grpo/toy.yaml, a KL term so that the reference pass runs: `--beta 0.04`)
from the shipped warm model on a BM25 index, `--steps` steps on 2 processes, one question each a step, one
chain's rows a micro-step (per_device_train_batch_size 4: the 8B configs' one chain a micro-step, at the
toy's group size). Forwards are counted in trl's log-probability function wherever it runs without
gradients (the pass before the loss), so code from before this one counts alike: with `--baseline DIR`
(a checkout of earlier code) the same run goes first on that code.

    python benchmarks/grpo_ranks.py [--steps 3] [--baseline /path/to/old/checkout]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def worker(argv: list[str], count_file: str) -> None:
    """One process of the run: trl's log-probability function counted, then the GRPO recipe."""
    import torch
    from trl import GRPOTrainer

    original = GRPOTrainer._get_per_token_logps_and_entropies
    counts = {"forwards": 0, "rows": 0}

    def counted(self, model, input_ids, *args, batch_size=None, **kwargs):  # noqa: ANN001
        if not torch.is_grad_enabled():
            size = batch_size or input_ids.size(0)
            counts["forwards"] += -(-input_ids.size(0) // size)
            counts["rows"] += input_ids.size(0)
        return original(self, model, input_ids, *args, batch_size=batch_size, **kwargs)

    GRPOTrainer._get_per_token_logps_and_entropies = counted
    from corag.recipes.grpo import main

    try:
        main(argv)
    finally:
        Path(f"{count_file}.{os.environ.get('RANK', '0')}").write_text(json.dumps(counts))


def prepare(out: Path) -> tuple[Path, Path]:
    """A toy world and its BM25 index."""
    from corag.data.corpus import Corpus
    from corag.retrieval.index import build_bm25
    from corag.toy.world import generate_world

    if not (out / "index" / "manifest.json").exists():
        generate_world(seed=0).write(out / "world")
        build_bm25(Corpus.load(out / "world" / "corpus.jsonl"), out / "index")
    return out / "world", out / "index"


def run(source: Path, name: str, out: Path, world: Path, index: Path, steps: int) -> dict:
    """The 2-process run on the code in `source`; its forwards a step (per process) and step time."""
    from corag.toy.quickstart import WARM

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder, count_file = out / name, out / f"{name}.counts"
    recipe = [
        "--config", str(REPO / "configs/grpo/toy.yaml"), "--model_name_or_path", str(WARM),
        "--output_dir", str(folder), "--questions", str(world / "train.jsonl"), "--limit", "40",
        "--corpus", str(world / "corpus.jsonl"), "--retriever", str(index), "--max_steps", str(steps),
        "--save_strategy", "no", "--logging_steps", "1", "--beta", "0.04", "--report_to", "none",
        "--per_device_train_batch_size", "4",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(source), "OMP_NUM_THREADS": "1"}
    launch = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
    ]
    subprocess.run([*launch, __file__, "--worker", str(count_file), *recipe], check=True, env=env, cwd=out)
    counts = [json.loads(Path(f"{count_file}.{rank}").read_text()) for rank in (0, 1)]
    state = json.loads((folder / "trainer_state.json").read_text())
    metrics = json.loads((folder / "train_results.json").read_text())
    return {
        "steps": state["global_step"],
        "forwards_per_step": [c["forwards"] / state["global_step"] for c in counts],
        "rows_per_step": [c["rows"] / state["global_step"] for c in counts],
        "step_s": round(metrics["train_runtime"] / state["global_step"], 1),
    }


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[3:], sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="runs/bench-grpo-ranks")
    parser.add_argument("--baseline", help="a checkout of the code to compare with (run first)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    world, index = prepare(out)
    result = {}
    if args.baseline:
        result["before"] = run(Path(args.baseline).resolve(), "before", out, world, index, args.steps)
    result["after"] = run(REPO, "after", out, world, index, args.steps)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
