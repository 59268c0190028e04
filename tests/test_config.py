"""Stage configs (corag/config.py): YAML files, `base:` files under them, flags over both."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from corag.config import load_yaml, parse_config, read_config
from corag.errors import InputError


@dataclass
class Settings:
    out: str
    chains: str | None = None
    dataset: str | None = None
    format: str | None = None
    limit: int | None = None
    temperature: float = 0.7

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be 0 or more")


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


def test_flags_win_over_the_file_and_none_unsets_a_key(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("out: o\nchains: chains.jsonl\nlimit: 5\n")
    settings = parse_config(Settings, ["--config", str(config), "--dataset", "d"])
    assert (settings.chains, settings.dataset, settings.limit) == ("chains.jsonl", "d", 5)
    settings = parse_config(
        Settings, ["--config", str(config), "--chains", "none", "--limit=NULL", "--dataset", "d"]
    )
    assert (settings.chains, settings.dataset, settings.limit) == (None, "d", None)
    assert parse_config(Settings, ["--config", str(config), "--chains", "c2"]).chains == "c2"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "o", "--temprature", "1"], "unknown flag --temprature; did you mean --temperature?"),
        (["--out", "o", "--fmt", "jsonl"], "unknown flag --fmt; did you mean --format?"),  # renamed
        (["--out", "o", "--output", "d"], "unknown flag --output; did you mean --dataset?"),  # renamed
        (["--ouut", "o"], "unknown flag --ouut; did you mean --out?"),  # before --out is found missing
        (["--out", "o", "--zzzzzz"], "unknown flag --zzzzzz; see --help"),
        (["--out", "o", "--lim", "3"], "unknown flag --lim; did you mean --limit?"),  # no prefixes
        (["--out", "o", "--temp=1"], "unknown flag --temp; did you mean --temperature?"),
        (["--o", "o"], "unknown flag --o; did you mean --out?"),
        (["--out", "o", "stray"], "unrecognized arguments: stray"),
        ([], "the following arguments are required: --out"),
        (["--out", "o", "--limit", "many"], "argument --limit: invalid int value: 'many'"),
        (["--out", "o", "--temperature", "-1"], "temperature must be 0 or more"),
    ],
)
def test_every_mistake_is_one_input_error(argv, message):
    with pytest.raises(InputError) as error:
        parse_config(Settings, argv)
    assert str(error.value) == message


def test_an_unknown_key_names_the_closest(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("out: o\ntemprature: 0.3\n")
    with pytest.raises(
        InputError, match=r"c\.yaml, field 'temprature': unknown config key; did you mean temperature\?"
    ):
        parse_config(Settings, ["--config", str(config)])


def test_read_config_gives_every_field_without_requiring_or_building(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("temperature: -1\nlimit: '3'\n")
    assert read_config([Settings], ["--config", str(config)]) == {
        "out": None, "chains": None, "dataset": None, "format": None, "limit": 3, "temperature": -1,
    }  # fmt: skip
    config.write_text("temprature: 1\n")
    with pytest.raises(InputError, match="did you mean temperature"):
        read_config([Settings], ["--config", str(config)])
