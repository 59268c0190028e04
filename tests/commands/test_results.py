"""`corag results ROOT --layout search-r1` over evaluation folders that `corag evaluate --predictions`
wrote: the suite's seven sets as columns, a row per method, model and rule, EM and tokens per question."""

from __future__ import annotations

import json
from pathlib import Path

from corag.cli import main
from corag.commands.results import SUITE_COLUMNS, model_name

SETS = list(SUITE_COLUMNS)  # nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle


def _write(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _evaluate(
    root: Path, data: Path, folder: str, run: str, model: str, answers: list[str], tokens: list[int]
):
    """Score predictions with the real command, into ROOT/<folder>/<run>/metrics.json."""
    preds = [
        {"query_id": f"q{i}", "prediction": a, "usage": {"total_tokens": t}}
        for i, (a, t) in enumerate(zip(answers, tokens, strict=True))
    ]
    pred_file = _write(root.parent / "preds" / folder / f"{run}.jsonl", preds)
    out = root / folder / run
    args = ["evaluate", "--data", str(data), "--predictions", str(pred_file), "--out-dir", str(out)]
    assert main([*args, "--rules", "search-r1", "--model", model]) == 0


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_suite_table_has_a_row_per_method_and_model_and_the_seven_sets_as_columns(tmp_path, capsys):
    root = tmp_path / "eval"
    expected_em, expected_tokens = {}, {}
    for i, name in enumerate(SETS):
        records = [
            {"id": f"q{k}", "question": f"{name} question {k}?", "golden_answers": [f"Ans{k}"]}
            for k in (0, 1)
        ]
        data = _write(tmp_path / "FlashRAG_datasets" / name / "test.jsonl", records)
        # search-r1 answers question 0 everywhere and question 1 on every other set; costs grow by set
        second = "Ans1" if i % 2 == 0 else "wrong"
        tokens = [100, 100 * (i + 1)]
        _evaluate(root, data, name, "search-r1", "hub/SearchR1-7b", ["Ans0", second], tokens)
        expected_em[name] = 100.0 if i % 2 == 0 else 50.0
        expected_tokens[name] = sum(tokens) / 2
        if name in ("nq", "hotpotqa"):  # a second model and method, on two sets only
            _evaluate(
                root, data, f"{name}-b", "greedy_L2", "runs/sft/model/checkpoint-500", ["no", "no"], [7, 9]
            )
    other = _write(
        tmp_path / "multihopqa_dev.jsonl", [{"id": "q0", "question": "q?", "golden_answers": ["a"]}]
    )
    _evaluate(root, other, "other", "search-r1", "hub/SearchR1-7b", ["a"], [5])
    capsys.readouterr()

    assert main(["results", str(root), "--layout", "search-r1"]) == 0
    out = capsys.readouterr().out
    lines = (root / "search-r1.md").read_text().splitlines()
    assert lines[0] == "EM (%)" and "Tokens per question" in lines
    header = _cells(lines[2])
    assert header == ["method", "model", "rule", "NQ", "TriviaQA", "PopQA", "HotpotQA", "2Wiki", "MuSiQue", "Bamboogle", "Avg."]  # fmt: skip
    em_rows = {tuple(_cells(line)[:2]): _cells(line) for line in lines[4:6]}
    first = em_rows["search-r1", "SearchR1-7b"]
    assert first[2] == "search-r1"
    assert first[3:10] == [f"{expected_em[n]:.1f}" for n in SETS]
    assert first[10] == f"{sum(expected_em.values()) / 7:.1f}"
    second = em_rows["greedy_L2", "model/checkpoint-500"]
    assert second[3:] == ["0.0", "", "", "0.0", "", "", "", "0.0 (2/7)"]
    # the paper's figures of the released checkpoints below the measured ones, the source named
    published_at = next(i for i, line in enumerate(lines) if line.startswith("Published EM (%)"))
    assert "arXiv:2503.09516, Table 2" in lines[published_at]
    published = {tuple(_cells(line)[:2]): _cells(line) for line in lines[published_at + 4 : published_at + 8]}
    assert published["Search-R1-base (PPO)", "Qwen2.5-7B"][3:] == [
        "48.0", "63.8", "45.7", "43.3", "38.2", "19.6", "43.2", "43.1"
    ]  # fmt: skip
    assert len(published) == 4 and published_at < lines.index("Tokens per question")
    tokens_at = lines.index("Tokens per question") + 4
    tokens_row = next(_cells(line) for line in lines[tokens_at:] if line.startswith("| search-r1"))
    assert tokens_row[3:10] == [f"{expected_tokens[n]:.1f}" for n in SETS]
    assert "left out, not one of the suite's sets: 1 run(s): other/search-r1 (multihopqa)" in out
    csv_lines = (root / "search-r1.csv").read_text().splitlines()
    assert csv_lines[0].startswith("method,model,rule,sets,NQ EM,NQ tokens,TriviaQA EM,")
    assert csv_lines[2].endswith(",2,0.0,8.0,,,,,0.0,8.0,,,,,,,0.0,8.0")

    # two evaluations of one cell are refused, naming both folders
    data = tmp_path / "FlashRAG_datasets" / "nq" / "test.jsonl"
    _evaluate(root, data, "nq-again", "search-r1", "hub/SearchR1-7b", ["Ans0", "Ans1"], [1, 1])
    capsys.readouterr()
    assert main(["results", str(root), "--layout", "search-r1"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and str(root / "nq-again") in error
    assert (
        "two evaluations of NQ for run 'search-r1', model 'SearchR1-7b', rule 'search-r1' (also nq)" in error
    )


def test_no_suite_evaluation_is_one_line(tmp_path, capsys):
    other = _write(
        tmp_path / "multihopqa_dev.jsonl", [{"id": "q0", "question": "q?", "golden_answers": ["a"]}]
    )
    _evaluate(tmp_path / "eval", other, "other", "run", "m", ["a"], [5])
    capsys.readouterr()
    assert main(["results", str(tmp_path / "eval"), "--layout", "search-r1"]) == 2
    assert "no evaluation of the suite's sets" in capsys.readouterr().err
    assert not (tmp_path / "eval" / "search-r1.md").exists()


def test_model_names():
    assert model_name("PeterJinGo/SearchR1-nq_hotpotqa_train-qwen2.5-7b-em-ppo").startswith("SearchR1-nq")
    assert model_name("runs/sft/llama/checkpoint-500/") == "llama/checkpoint-500"
    assert model_name(None) == ""
