"""Seeing GRPO learn: held-out accuracy during training, a table of rollouts, a plot at the end.

Written into the run's output folder by the main process:
- `heldout.jsonl`: at step 0, every `eval_steps` (else `logging_steps`) steps and at the end, the policy's
  EM, F1 and tokens per question on a fixed held-out slice, decoded as `corag evaluate` decodes it (the
  same strategies, executor and scoring rules); also logged beside trl's metrics (`heldout_em`, ...).
- `rollouts.jsonl`: at every logging step, the chains of one group (question, sub-queries, sub-answers,
  answer, gold answers, reward, advantage); a W&B table too when W&B is logging.
- `progress.png`: training reward and held-out EM against step, at the end.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accelerate.utils import gather_object
from transformers import TrainerCallback

from corag.chain import CorpusLike
from corag.evaluation import answer_row, as_record, methods, parse_runs, rule_of
from corag.executor import Executor
from corag.retrieval.base import Retriever
from corag.training.rollout import Chain
from corag.types import Example


class HeldOut:
    """A fixed slice of held-out questions and the decoding that answers them (a `corag evaluate` method
    spec such as `greedy:L=3`)."""

    def __init__(
        self, questions: Sequence[Example], method: str, corpus: CorpusLike, retriever: Retriever
    ) -> None:
        (self.run,) = parse_runs([method])  # one point: a grid is refused by the unpacking
        self.questions, self.corpus, self.retriever = list(questions), corpus, retriever

    def scores(self, lm: Any, part: int = 0, parts: int = 1) -> list[dict[str, float]]:
        """EM, F1 (points, 0 or 100 for EM) and tokens of each question in this process's part."""
        strategy = methods()[self.run.method]
        questions = self.questions[part::parts]
        executor = Executor(lm, self.retriever)
        results = executor.run(
            [strategy(executor.context(), q, corpus=self.corpus, **self.run.kwargs) for q in questions]
        )
        rows = []
        for question, result in zip(questions, results, strict=True):
            record = as_record(result)  # a chain's result, or a method's record
            row = answer_row(record["predictions"], question, rule_of(question))
            tokens = float(record["usage"]["total_tokens"])
            rows.append({"em": 100 * row["em"], "f1": 100 * row["f1"], "tokens": tokens})
        return rows


def summary(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Means over the questions, rounded as tables show them."""
    return {key: round(statistics.fmean(r[key] for r in rows), 2) for key in ("em", "f1", "tokens")}


def rollout_records(groups: Sequence[Sequence[Chain]], step: int, limit: int = 1) -> list[dict[str, Any]]:
    """The chains of the first `limit` groups as table rows."""
    return [
        {
            "step": step,
            "question": chain.result.query,
            "subqueries": [s.subquery for s in chain.result.steps],
            "subanswers": [s.subanswer for s in chain.result.steps],
            "answer": chain.result.prediction,
            "gold": list(chain.result.answers),
            "stopped": chain.stopped,
            "reward": round(chain.reward, 4),
            "advantage": round(chain.advantage, 4),
        }
        for group in groups[:limit]
        for chain in group
    ]


def append_jsonl(path: Path, records: Sequence[dict[str, Any]]) -> None:
    with path.open("a", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_by_step(path: Path) -> dict[int, dict[str, Any]]:
    """A progress file's records by step (a step written twice, by a run resumed past it: the last)."""
    if not path.exists():
        return {}
    records = (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return {record["step"]: record for record in records}


def plot_progress(
    log_history: Sequence[dict[str, Any]], held_out: dict[int, dict[str, Any]], path: Path
) -> None:
    """Training reward and held-out EM against step, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rewards = [(row["step"], row["reward"]) for row in log_history if "reward" in row]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 5), sharex=True)
    top.plot([s for s, _ in rewards], [r for _, r in rewards], marker=".")
    top.set_ylabel("training reward")
    steps = sorted(held_out)
    bottom.plot(steps, [held_out[s]["em"] for s in steps], marker="o")
    bottom.set_ylabel("held-out EM")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class ProgressFiles(TrainerCallback):
    """Writes the progress files of a ChainGRPOTrainer (see the module's docstring)."""

    def __init__(self, trainer: Any, held_out: HeldOut | None) -> None:
        self.trainer, self.held_out = trainer, held_out
        self.out = Path(trainer.args.output_dir)
        steps = trainer.args.eval_steps
        self.interval = int(steps) if steps and steps >= 1 else trainer.args.logging_steps

    @property
    def main(self) -> bool:
        return self.trainer.accelerator.is_main_process

    def evaluate(self, step: int, log: bool = True) -> None:
        """The held-out slice answered by the policy, split over the processes, written (and, with `log`,
        logged with trl's metrics of this step)."""
        accelerator = self.trainer.accelerator
        rows = self.trainer.with_policy(
            lambda lm: self.held_out.scores(lm, accelerator.process_index, accelerator.num_processes)
        )
        scores = summary([row for part in gather_object([rows]) for row in part])
        for key, value in scores.items() if log else ():
            self.trainer._metrics["train"][f"heldout_{key}"].append(value)
        if self.main:
            append_jsonl(self.out / "heldout.jsonl", [{"step": step, **scores}])

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001 (transformers' signature)
        if self.main:
            self.out.mkdir(parents=True, exist_ok=True)
        if self.held_out and state.global_step == 0:
            self.evaluate(0, log=False)  # before any step: no log row of its own

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        step = state.global_step
        if self.main and step % args.logging_steps == 0 and self.trainer.last_groups:
            records = rollout_records(self.trainer.last_groups, step)
            append_jsonl(self.out / "rollouts.jsonl", records)
            log_wandb_table(args, records)
        if self.held_out and step % self.interval == 0:
            self.evaluate(step)

    def on_train_end(self, args, state, control, **kwargs):  # noqa: ANN001
        if self.held_out and state.global_step % self.interval:
            self.evaluate(state.global_step, log=False)  # after the last log row
        if self.main:
            held = read_by_step(self.out / "heldout.jsonl")
            plot_progress(state.log_history, held, self.out / "progress.png")


def log_wandb_table(args: Any, records: Sequence[dict[str, Any]]) -> None:
    """The rollouts as a W&B table, when the run logs to W&B."""
    if "wandb" not in (args.report_to or []):
        return
    import wandb

    if wandb.run is None or not records:
        return
    columns = list(records[0])
    rows = [[json.dumps(r[c]) if isinstance(r[c], list) else r[c] for c in columns] for r in records]
    wandb.log({"rollouts": wandb.Table(columns=columns, data=rows)}, commit=False)
