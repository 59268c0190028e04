"""Stage configs: dataclasses read from a YAML file (`--config`) and overridable on the command line."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, TypeVar

import yaml

from corag.errors import InputError

T = TypeVar("T")


def parse_config(cls: type[T], argv: list[str] | None, description: str = "") -> T:
    """Build `cls` from `--config file.yaml` (if given) overridden by `--field value` flags.

    An unknown key in the YAML file is an InputError naming the file and the key; an unknown flag is
    argparse's usual error.
    """
    from transformers import HfArgumentParser

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, rest = pre.parse_known_args(argv)
    parser = HfArgumentParser(cls, description=description)
    parser.add_argument("--config", help="YAML file of defaults; flags override it")
    if known.config:
        values = known_keys(known.config, {f.name for f in dataclasses.fields(cls)})  # type: ignore[arg-type]
        parser.set_defaults(**values)
        # Fields required on the command line are satisfied by the file.
        for action in parser._actions:
            if action.dest in values:
                action.required = False
    return parser.parse_args_into_dataclasses(args=rest)[0]


def known_keys(path: str, names: set[str]) -> dict[str, Any]:
    """The YAML mapping of config file `path`; a key outside `names` is an InputError naming it."""
    values = load_yaml(path)
    for key in values:
        if key not in names:
            raise InputError(f"unknown config key; known keys: {sorted(names)}", file=path, field=key)
    return values


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from a file, with a clear error for anything else.

    A `base: other.yaml` key (a path relative to the file) reads that file first and lays this one's keys
    over it, so configs that share settings keep them in one place.
    """
    return _load_yaml(Path(path), ())


def _load_yaml(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"cannot read YAML: {exc}", file=str(path)) from None
    if not isinstance(values, dict):
        raise InputError("a config file must hold a mapping of keys to values", file=str(path))
    base = values.pop("base", None)
    if base is None:
        return values
    if not isinstance(base, str):
        raise InputError("must be the path of another YAML file", file=str(path), field="base")
    base_path = (path.parent / base).resolve()
    if base_path in seen:
        raise InputError("bases form a cycle", file=str(path), field="base")
    return {**_load_yaml(base_path, (*seen, path.resolve())), **values}


def parse_args_with_config(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse `argv` with an argparse `parser` whose defaults come from `--config file.yaml` (if given).

    The YAML keys are the options' names with underscores (`out_dir`, `max_batch_tokens`); an unknown
    key is an InputError naming the file and the key, and options required on the command line are
    satisfied by the file.
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    parser.add_argument("--config", help="YAML file of defaults (keys: option names with underscores)")
    if known.config:
        values = known_keys(
            known.config, {a.dest for a in parser._actions if a.dest not in ("help", "config")}
        )
        parser.set_defaults(**values)
        for action in parser._actions:
            if action.dest in values:
                action.required = False
        for group in parser._mutually_exclusive_groups:
            if any(a.dest in values for a in group._group_actions):
                group.required = False
    return parser.parse_args(argv)
