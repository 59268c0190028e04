"""`corag results ROOT`: one table over several evaluations (`ROOT/<dataset>/<run>/metrics.json`).

evaluation/slurm_eval.sh runs it at the end; it writes ROOT/results.md and ROOT/results.csv and prints
the table. `--layout search-r1` lays the same folders out as the Search-R1 suite's leaderboard
(FlashRAG's table of reasoning methods): a row per method, model and rule, the seven sets as columns
(NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue, Bamboogle) and their average, EM in one table, the
published EM of the released Search-R1 checkpoints below it (the paper's table, source named), and tokens
per question in a third; written to ROOT/search-r1.md and ROOT/search-r1.csv (measured figures only).
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corag.config import parse_config
from corag.errors import InputError
from corag.evaluation import folder_results, merged_results
from corag.scaling import format_markdown

# The suite's sets in the leaderboard's order: the task each evaluation records -> its column.
SUITE_COLUMNS = {
    "nq": "NQ",
    "triviaqa": "TriviaQA",
    "popqa": "PopQA",
    "hotpotqa": "HotpotQA",
    "2wikimultihopqa": "2Wiki",
    "musique": "MuSiQue",
    "bamboogle": "Bamboogle",
}
AVERAGE = "Avg."
ROW_KEYS = ("method", "model", "rule")
# The released checkpoints' EM (%) on the seven sets, in the columns' order, as Search-R1's paper
# publishes them (rows Search-R1-base / Search-R1-instruct, trained with PPO on NQ + HotpotQA).
PUBLISHED_SOURCE = (
    "Jin et al., Search-R1: Training LLMs to Reason and Leverage Search Engines with Reinforcement "
    "Learning, arXiv:2503.09516, Table 2"
)
PUBLISHED = {
    ("Search-R1-base (PPO)", "Qwen2.5-7B"): (48.0, 63.8, 45.7, 43.3, 38.2, 19.6, 43.2),
    ("Search-R1-instruct (PPO)", "Qwen2.5-7B-Instruct"): (39.3, 61.0, 39.7, 37.0, 41.4, 14.6, 36.8),
    ("Search-R1-base (PPO)", "Qwen2.5-3B"): (40.6, 58.7, 43.5, 28.4, 27.3, 4.9, 8.8),
    ("Search-R1-instruct (PPO)", "Qwen2.5-3B-Instruct"): (34.1, 54.5, 37.8, 32.4, 31.9, 10.3, 26.4),
}


@dataclass
class ResultsArgs:
    root: str = field(metadata={"positional": True, "help": "folder of evaluation folders, one per dataset"})
    layout: str = field(
        default="runs",
        metadata={
            "choices": ["runs", "search-r1"],
            "help": "runs: a row per dataset and run; search-r1: the Search-R1 suite's leaderboard (a row "
            "per method, model and rule, the seven sets as columns, EM and tokens per question)",
        },
    )


def model_name(model: Any) -> str:
    """A model as a table names it: the last part of its path or hub name (two for `checkpoint-N`)."""
    if not isinstance(model, str) or not model:
        return ""
    parts = Path(model.rstrip("/")).parts
    return "/".join(parts[-2:]) if parts[-1].startswith("checkpoint") and len(parts) > 1 else parts[-1]


def suite_cells(root: Path) -> tuple[dict[tuple[str, str, str], dict[str, dict]], list[str]]:
    """Each evaluation under `root` by row (method, model, rule) and column (the suite's set), and the
    runs left out (a task outside the suite, or a mixed file), as `<folder>/<run> (<task>)`. Two
    evaluations for one cell are an InputError naming both."""
    cells: dict[tuple[str, str, str], dict[str, dict]] = {}
    where: dict[tuple[tuple[str, str, str], str], str] = {}
    left_out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        for run, summary in folder_results(folder).items():
            settings = summary.get("settings") or {}
            key = (str(run), model_name(settings.get("model")), str(summary.get("rule", "")))
            column = SUITE_COLUMNS.get(str(summary.get("task")))
            if column is None:
                left_out.append(f"{folder.name}/{run} ({summary.get('task')})")
                continue
            if (key, column) in where:
                raise InputError(
                    f"two evaluations of {column} for run {run!r}, model {key[1]!r}, rule {key[2]!r} "
                    f"(also {where[key, column]}): keep one",
                    file=str(folder),
                )
            where[key, column] = folder.name
            cells.setdefault(key, {})[column] = summary
    return cells, left_out


def suite_rows(cells: dict[tuple[str, str, str], dict[str, dict]], metric: str) -> list[dict[str, Any]]:
    """One table's rows: `metric` of each row's evaluations by set, their mean (`Avg.`) and how many of
    the seven sets it covers (`sets`)."""
    rows = []
    for key, by_set in cells.items():
        row: dict[str, Any] = dict(zip(ROW_KEYS, key, strict=True))
        values = [float(by_set[c][metric]) for c in SUITE_COLUMNS.values() if metric in by_set.get(c, {})]
        row.update({c: float(s[metric]) for c, s in by_set.items() if metric in s})
        row[AVERAGE] = sum(values) / len(values) if values else ""
        row["sets"] = len(values)
        rows.append(row)
    return rows


def published_rows() -> list[dict[str, Any]]:
    """The paper's figures as rows of the EM table (rule: Search-R1's EM; the average over the seven)."""
    return [
        {
            "method": method,
            "model": model,
            "rule": "search-r1",
            **dict(zip(SUITE_COLUMNS.values(), values, strict=True)),
            AVERAGE: sum(values) / len(values),
        }
        for (method, model), values in PUBLISHED.items()
    ]


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    """A row as the markdown shows it: an average over fewer than the seven sets says over how many."""
    if row["sets"] == len(SUITE_COLUMNS) or not row["sets"]:
        return row
    return {**row, AVERAGE: f"{row[AVERAGE]:.1f} ({row['sets']}/{len(SUITE_COLUMNS)})"}


def suite_table(root: Path) -> tuple[str, list[str]]:
    """The leaderboard's layout over `root`'s evaluations (EM, then tokens per question), written to
    `root/search-r1.md` and `.csv`; returns the markdown and the runs left out."""
    cells, left_out = suite_cells(root)
    if not cells:
        raise InputError(
            f"no evaluation of the suite's sets ({', '.join(SUITE_COLUMNS)}) under this folder",
            file=str(root),
        )
    columns = [*ROW_KEYS, *SUITE_COLUMNS.values(), AVERAGE]
    em, tokens = suite_rows(cells, "em"), suite_rows(cells, "tokens_per_question")
    text = (
        f"EM (%)\n\n{format_markdown([_shown(r) for r in em], columns)}\n\n"
        f"Published EM (%) of the released checkpoints ({PUBLISHED_SOURCE})\n\n"
        f"{format_markdown(published_rows(), columns)}\n\n"
        f"Tokens per question\n\n{format_markdown([_shown(r) for r in tokens], columns)}\n"
    )
    (root / "search-r1.md").write_text(text)
    measured = columns[len(ROW_KEYS) :]
    with (root / "search-r1.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*ROW_KEYS, "sets", *(f"{c} {m}" for c in measured for m in ("EM", "tokens"))])
        for a, b in zip(em, tokens, strict=True):
            cells_ab = (r.get(c, "") for c in measured for r in (a, b))
            writer.writerow([*(a[k] for k in ROW_KEYS), a["sets"], *cells_ab])
    return text, left_out


def main(argv: list[str] | None = None) -> int:
    args = parse_config(ResultsArgs, sys.argv[1:] if argv is None else argv, __doc__.splitlines()[0])
    root = Path(args.root)
    if not root.is_dir():
        raise InputError("no such folder", file=args.root)
    if args.layout == "runs":
        print(merged_results(root).read_text())
        return 0
    text, left_out = suite_table(root)
    print(text)
    if left_out:
        print(f"left out, not one of the suite's sets: {len(left_out)} run(s): {', '.join(left_out)}")
    print(f"tables in {root / 'search-r1.md'} and {root / 'search-r1.csv'}")
    return 0
