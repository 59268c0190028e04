"""corag.resources: the shipped configs and launch scripts are found from wherever corag is installed, not
only from a checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from corag.errors import InputError
from corag.resources import STAGE_SCRIPTS, stage_script

ROOT = Path(__file__).resolve().parents[1]

FIND = """
import json
from pathlib import Path
import corag
from corag.cluster.rounds import SCRIPTS
from corag.plan import script_limit
from corag.resources import STAGE_SCRIPTS, stage_script
print(json.dumps({
    "package": corag.__file__,
    "scripts": {stage: str(stage_script(stage)) for stage in STAGE_SCRIPTS},
    "rounds": SCRIPTS,
    "limit": script_limit("sft"),
}))
"""


def test_every_stage_has_a_script_of_one_exec_line_linked_from_the_checkout():
    for stage, name in STAGE_SCRIPTS.items():
        script = stage_script(stage)
        lines = [
            line for line in script.read_text().splitlines() if line.strip() and not line.startswith("#")
        ]
        assert "#SBATCH --job-name=corag-" in script.read_text()
        assert len(lines) == 1 and lines[0].startswith("exec ") and "corag.cluster.node" in lines[0], script
        links = [p for p in ROOT.glob(f"*/{name}") if p.is_symlink()]
        assert [p.resolve() for p in links] == [script.resolve()], name
    assert stage_script("sft") == stage_script("grpo") == stage_script("train")


def test_an_unknown_stage_is_one_line():
    with pytest.raises(InputError, match="no launch script for stage 'smaple'; stages: sample, pool"):
        stage_script("smaple")


@pytest.mark.slow
def test_the_scripts_are_found_from_a_non_editable_install_in_an_empty_folder(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)
    shutil.copytree(ROOT / "corag", source / "corag", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target),
         str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    found = json.loads(
        subprocess.run(
            [sys.executable, "-c", FIND], cwd=empty, env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    assert Path(found["package"]).is_relative_to(target)
    for stage, script in found["scripts"].items():
        assert Path(script).is_relative_to(target) and Path(script).is_file(), stage
        assert "-m corag.cluster.node" in Path(script).read_text()
    assert set(found["rounds"].values()) <= set(found["scripts"].values())
    assert found["limit"] == [48 * 3600, "slurm_train.sh #SBATCH --time=48:00:00"]
