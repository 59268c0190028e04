import numpy as np

from corag.scaling import (
    fit_log_curve,
    format_markdown,
    log_curve,
    pareto_frontier,
    plot_scaling,
    scaling_figure,
    write_table,
)


def test_pareto_frontier_keeps_only_undominated_points():
    tokens = [100, 200, 150, 400, 300, 50]
    acc = [10, 30, 5, 35, 30, 10]
    # (50,10) beats (100,10); (150,5) is dominated; (300,30) is dominated by (200,30).
    assert pareto_frontier(tokens, acc) == [5, 1, 3]


def test_log_fit_recovers_parameters():
    x = np.array([100, 300, 1000, 3000, 10000], dtype=float)
    y = log_curve(x, 5.0, 20.0, -3.0)
    a, b, c = fit_log_curve(x, y)
    assert np.allclose(log_curve(x, a, b, c), y, atol=1e-3)
    assert fit_log_curve(x[:3], y[:3]) is None  # three parameters interpolate any three points


def test_table_and_plot(tmp_path):
    rows = [
        {"method": "greedy", "em": 12.5, "tokens": 900.0},
        {"method": "tree", "em": 20.0, "tokens": 5000.0},
    ]
    md, csv_path = write_table(rows, ["method", "em", "tokens"], tmp_path / "table")
    assert md.read_text().splitlines()[2] == "| greedy | 12.5 | 900.0 |"
    assert csv_path.read_text().splitlines()[0] == "method,em,tokens"
    assert "| tree |" in format_markdown(rows, ["method"])
    png = plot_scaling(["a", "b", "c"], [100, 1000, 10000], [10, 20, 25], tmp_path / "plot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_close_points_get_labels_that_do_not_overlap():
    names = ["corag_greedy", "warm_greedy", "no_retrieval", "corag_tree", "corag_best_of_4"]
    tokens = [2396, 2435, 129, 10715, 7785]
    accuracy = [42.0, 42.3, 0.3, 32.7, 30.3]  # the first two a few pixels apart
    fig = scaling_figure(names, tokens, accuracy, "EM")
    renderer = fig.canvas.get_renderer()
    labels = {t.get_text(): t.get_window_extent(renderer) for t in fig.axes[0].texts}
    assert set(labels) == set(names)
    boxes = list(labels.values())
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    frame = fig.axes[0].get_window_extent(renderer)  # none runs past the axes (corag_tree is rightmost)
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)
