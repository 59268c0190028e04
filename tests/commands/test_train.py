"""`corag train` and the recipes from any folder: the console script and the checkout's thin scripts run
the package's recipes outside the checkout, and every default recipe and config path is a file inside the
installed package (package data, as pyproject.toml ships it)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import corag
from corag.cli import main
from corag.commands.iterate import TOY
from corag.iterate import IterateConfig
from corag.resources import CONFIGS, SFT_RECIPE
from corag.toy.quickstart import CONFIG as QUICKSTART
from corag.toy.study import StudyConfig

REPO = Path(__file__).resolve().parents[2]
PACKAGE = Path(corag.__file__).resolve().parent


@pytest.mark.parametrize(
    ("command", "usage"),
    [
        ([str(Path(sys.executable).parent / "corag"), "train", "sft"], "usage: corag train sft"),
        ([sys.executable, str(REPO / "recipes/grpo.py")], "usage: grpo.py"),
    ],
    ids=["corag train sft", "recipes/grpo.py"],
)
def test_a_recipe_starts_outside_the_checkout(tmp_path: Path, command: list[str], usage: str) -> None:
    done = subprocess.run([*command, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(usage) and "--model_name_or_path" in done.stdout


def test_train_names_its_recipes(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [([], "usage: corag train {sft,grpo}"), (["dpo"], "unknown recipe 'dpo'")]:
        with pytest.raises(SystemExit) as exit_:
            main(["train", *argv])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_default_recipe_and_configs_are_package_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    study = {f.name: f.default for f in dataclasses.fields(StudyConfig)}
    iterate = IterateConfig()
    defaults = [
        SFT_RECIPE,
        TOY,
        QUICKSTART,
        study["recipe"],
        study["sft_config"],
        iterate.recipe,
        iterate.sft_config,
    ]
    defaults += [CONFIGS / name for name in ("grpo/toy.yaml", "sampling/toy.yaml", "eval/toy.yaml")]
    defaults += [CONFIGS / f"accelerate/{name}.yaml" for name in ("single", "ddp", "zero3", "fsdp")]
    for path in map(Path, defaults):
        assert path.is_absolute() and path.is_file() and path.resolve().is_relative_to(PACKAGE), path
    assert (REPO / "configs").resolve() == CONFIGS.resolve()  # the checkout's configs/ is the package's


def test_pyproject_ships_every_config() -> None:
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {path for pattern in package_data["corag"] for path in (REPO / "corag").glob(pattern)}
    configs = {path for path in (REPO / "corag/configs").rglob("*") if path.is_file()}
    assert configs and configs <= shipped, sorted(map(str, configs - shipped))
