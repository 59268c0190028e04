"""The one config system: dataclasses read from a YAML file (`--config`) and overridable by flags.

Every command and recipe parses its settings with `parse_config`, in the style of trl's `TrlParser` and
transformers' `HfArgumentParser` (which it extends): each field of each dataclass is a `--field_name`
(or `--field-name`) flag; a YAML file given with `--config` supplies defaults for any of them, and a
`base: other.yaml` key in it lays the file over another. A field whose metadata holds
`positional=True` is a positional argument instead (`corag index CORPUS`).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, TypeVar, get_origin, overload

import yaml
from transformers import HfArgumentParser

from corag.errors import InputError

T = TypeVar("T")


class ConfigParser(HfArgumentParser):
    """HfArgumentParser whose fields may be positional (`metadata={"positional": True}`)."""

    @staticmethod
    def _parse_dataclass_field(parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
        if not field.metadata.get("positional"):
            HfArgumentParser._parse_dataclass_field(parser, field)
            return
        optional = (
            field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
        )
        many = get_origin(field.type) is list  # SHARD...: one or more values
        default = (
            field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        )
        parser.add_argument(
            field.name,
            metavar=field.name.upper(),
            help=field.metadata.get("help"),
            nargs=field.metadata.get(
                "nargs", ("*" if optional else "+") if many else ("?" if optional else None)
            ),
            default=default if optional else None,
        )


@overload
def parse_config(classes: type[T], argv: list[str] | None, description: str = "") -> T: ...
@overload
def parse_config(classes: tuple[type, ...], argv: list[str] | None, description: str = "") -> tuple: ...
def parse_config(classes: Any, argv: list[str] | None, description: str = "") -> Any:
    """Build `classes` (one dataclass, or a tuple of them) from `--config file.yaml` (if given)
    overridden by flags; returns one instance, or a tuple in the order of `classes`.

    A YAML key that names no field of any of the classes is an InputError naming the file and the key;
    fields required on the command line are satisfied by the file; an unknown flag is argparse's usual
    error.
    """
    single = isinstance(classes, type)
    classes = (classes,) if single else tuple(classes)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, rest = pre.parse_known_args(argv)
    parser = ConfigParser(classes, description=description)
    parser.add_argument("--config", help="YAML file of settings (keys: field names); flags override it")
    if known.config:
        values = known_keys(known.config, {f.name for cls in classes for f in dataclasses.fields(cls)})
        parser.set_defaults(**values)
        for action in parser._actions:
            if action.dest in values:
                action.required = False
                if not action.option_strings:  # a positional the file supplies may be left out
                    action.nargs = "*" if action.nargs == "+" else "?"
    parsed = parser.parse_args_into_dataclasses(args=rest, look_for_args_file=False)
    return parsed[0] if single else tuple(parsed[: len(classes)])  # the rest: the --config namespace


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
