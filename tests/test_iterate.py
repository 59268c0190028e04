"""corag iterate (corag/iterate.py): rounds of sample, train and evaluate, each round's model sampling the
next, resumable at every stage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from corag.cli import main as cli
from corag.errors import InputError
from corag.retrieval.bm25 import build_bm25_folder

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def flags(toy_world, toy_dir, tiny_model_dir, tmp_path_factory) -> list[str]:
    index = tmp_path_factory.mktemp("iterate") / "index"
    build_bm25_folder([toy_world.passages], index, num_docs=len(toy_world.passages))
    return [
        "--model", str(tiny_model_dir), "--questions", str(toy_dir / "train.jsonl"),
        "--corpus", str(toy_dir / "corpus.jsonl"), "--retriever", str(index),
        "--eval_data", str(toy_dir / "test.jsonl"), "--limit", "4", "--eval_limit", "3",
        "--methods", "greedy:L=1", "--num_chains", "2", "--max_length", "1", "--rounds", "2",
        "--recipe", str(REPO / "recipes/sft.py"), "--sft_config", str(REPO / "configs/sft/toy.yaml"),
        "--sft_args=--max_steps 1 --bf16 false",
    ]  # fmt: skip


def test_each_round_samples_with_the_last_model_and_resumes(flags, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "rounds"
    assert cli(["iterate", *flags, "--out_dir", str(out)]) == 0
    rows = json.loads((out / "rounds.json").read_text())
    assert [r["round"] for r in rows] == [1, 2]
    assert rows[0]["sampled_by"] == rows[0]["trained_from"] == str(tiny_model_dir)
    assert rows[1]["sampled_by"] == rows[1]["trained_from"] == str(out / "round1" / "model")  # init: last
    assert all(r["chains"] == 4 and "greedy:L=1 em" in r for r in rows)
    assert (out / "rounds.md").read_text().count("\n") == 4
    # the second round sampled anew (another model, the next seed)
    first, second = ((out / f"round{r}" / "chains.jsonl").read_text() for r in (1, 2))
    assert first != second
    # a rerun resumes: every stage done; with the second round's model gone, only it is trained again
    shutil.rmtree(out / "round2" / "model")
    capsys.readouterr()
    assert cli(["iterate", *flags, "--out_dir", str(out)]) == 0
    log = capsys.readouterr().out
    assert "[round 1: sample] already done" in log and "[round 1: train] already done" in log
    assert "[round 2: sample] already done" in log and "[round 2: train] done" in log
    assert json.loads((out / "rounds.json").read_text())[0] == rows[0]


def test_other_settings_in_the_same_folder_are_refused(flags, tmp_path):
    out = tmp_path / "rounds"
    assert cli(["iterate", *flags, "--out_dir", str(out), "--rounds", "1"]) == 0
    with pytest.raises(InputError, match=r"other settings \(init: 'last' -> 'base'\)"):
        from corag.commands.iterate import main

        main([*flags, "--out_dir", str(out), "--rounds", "1", "--init", "base"])


@pytest.mark.parametrize(
    ("extra", "field"),
    [(["--init", "first"], "init"), (["--rounds", "0"], "rounds"), (["--methods", "nope"], "methods")],
)
def test_bad_settings_are_one_line(flags, tmp_path, capsys, extra, field):
    try:  # argparse refuses a choice itself (SystemExit 2); corag refuses the rest (exit status 2)
        status = cli(["iterate", *flags, "--out_dir", str(tmp_path / "o"), *extra])
    except SystemExit as e:
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("corag iterate: error:") and field in err[-1]
