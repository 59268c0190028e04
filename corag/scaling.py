"""Accuracy against test-time compute: the Pareto frontier, its log fit, tables and the plot."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def pareto_frontier(tokens: Sequence[float], accuracy: Sequence[float]) -> list[int]:
    """Indices of the points no other point beats (fewer or equal tokens and higher accuracy), by tokens."""
    order = sorted(range(len(tokens)), key=lambda i: (tokens[i], -accuracy[i]))
    frontier: list[int] = []
    best = -math.inf
    for i in order:
        if accuracy[i] > best:
            frontier.append(i)
            best = accuracy[i]
    return frontier


def log_curve(x: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    return a * np.log(x + b) + c


def fit_log_curve(tokens: Sequence[float], accuracy: Sequence[float]) -> tuple[float, float, float] | None:
    """Least-squares fit of y = a*log(x+b)+c (b >= 0) to frontier points.

    None with 3 points or fewer: three parameters pass through any three points, so such a fit says
    nothing about the trend.
    """
    if len(tokens) <= 3:
        return None
    from scipy.optimize import curve_fit

    x, y = np.asarray(tokens, dtype=float), np.asarray(accuracy, dtype=float)
    try:
        params, _ = curve_fit(
            log_curve,
            x,
            y,
            p0=(
                max(float(np.ptp(y)), 1e-3) / max(math.log(x.max() / max(x.min(), 1.0) + 1.0), 1e-3),
                1.0,
                0.0,
            ),
            bounds=([-np.inf, 0.0, -np.inf], [np.inf, np.inf, np.inf]),
            maxfev=20000,
        )
    except (RuntimeError, ValueError):
        return None
    return float(params[0]), float(params[1]), float(params[2])


def write_table(rows: Sequence[dict], columns: Sequence[str], out_stem: Path) -> tuple[Path, Path]:
    """Write rows as `<stem>.md` (a markdown table) and `<stem>.csv`; return both paths."""
    md_path, csv_path = out_stem.with_suffix(".md"), out_stem.with_suffix(".csv")
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    md_path.write_text(format_markdown(rows, columns) + "\n")
    return md_path, csv_path


def format_markdown(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """A markdown table; floats with one decimal (accuracy in points) or none (tokens)."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:.1f}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def plot_scaling(
    names: Sequence[str], tokens: Sequence[float], accuracy: Sequence[float], path: Path, ylabel: str = "EM"
) -> Path:
    """Scatter accuracy against mean tokens per question, with the Pareto frontier and, when it has
    four points or more, its log fit; saved as an image to `path`."""
    import matplotlib.pyplot as plt

    fig = scaling_figure(names, tokens, accuracy, ylabel)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def scaling_figure(
    names: Sequence[str], tokens: Sequence[float], accuracy: Sequence[float], ylabel: str
) -> Any:
    """The figure of `plot_scaling`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.scatter(tokens, accuracy, color="tab:blue", zorder=3)
    front = pareto_frontier(tokens, accuracy)
    fx = [tokens[i] for i in front]
    fy = [accuracy[i] for i in front]
    ax.plot(fx, fy, color="tab:orange", linestyle="--", label="Pareto frontier")
    params = fit_log_curve(fx, fy)
    if params is not None:
        grid = np.linspace(min(fx), max(fx), 200)
        a, b, c = params
        ax.plot(
            grid, log_curve(grid, a, b, c), color="tab:green", label=f"fit {a:.2f}·log(x+{b:.0f})+{c:.1f}"
        )
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("mean tokens per question (log scale)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=min(0.0, min(accuracy)), top=max(10.0, 1.15 * max(accuracy)))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    _label_points(fig, ax, names, tokens, accuracy)
    return fig


def _label_points(fig: Any, ax: Any, names: Sequence[str], x: Sequence[float], y: Sequence[float]) -> None:
    """Name each point beside it: right of it, above or below at growing distance (left of it near the
    right edge), at the first place inside the axes that overlaps no name placed before."""
    fig.canvas.draw()  # fixes the layout, so that label extents are final
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    places = [(side, rise) for side in (4, -4) for rise in (5, -13, 15, -23, 25, -33, 35, 45)]
    placed: list[Any] = []
    for i in sorted(range(len(names)), key=lambda i: (x[i], y[i])):
        for side, rise in places:
            label = _annotate(ax, names[i], (x[i], y[i]), side, rise)
            box = label.get_window_extent(renderer)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.padded(3).overlaps(other) for other in placed):  # 3 px apart
                break
            label.remove()
        else:  # no free place: the first one
            box = _annotate(ax, names[i], (x[i], y[i]), *places[0]).get_window_extent(renderer)
        placed.append(box)


def _annotate(ax: Any, name: str, point: tuple[float, float], side: int, rise: int) -> Any:
    """`name` at (`side`, `rise`) points from `point`, right of it for a positive side, else left."""
    return ax.annotate(
        name,
        point,
        textcoords="offset points",
        xytext=(side, rise),
        ha="left" if side > 0 else "right",
        fontsize=7,
    )
