"""Stage configs (corag/config.py): YAML files, `base:` files under them, flags over both."""

from __future__ import annotations

import pytest

from corag.config import load_yaml
from corag.errors import InputError


def test_a_config_lays_its_keys_over_its_base(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "root.yaml").write_text("a: 1\nb: 2\nc: 3\n")
    (tmp_path / "shared" / "mid.yaml").write_text("base: root.yaml\nb: 20\n")
    (tmp_path / "run.yaml").write_text("base: shared/mid.yaml\nc: 30\nd: 40\n")
    assert load_yaml(tmp_path / "run.yaml") == {"a": 1, "b": 20, "c": 30, "d": 40}


def test_bad_bases_are_named(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\nx: 1\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(InputError, match=r"b\.yaml, field 'base': bases form a cycle"):
        load_yaml(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("base: missing.yaml\n")
    with pytest.raises(InputError, match=r"missing\.yaml: cannot read YAML"):
        load_yaml(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("base: [a.yaml]\n")
    with pytest.raises(InputError, match=r"d\.yaml, field 'base'"):
        load_yaml(tmp_path / "d.yaml")
