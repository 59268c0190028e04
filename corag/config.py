"""The one config system: dataclasses read from a YAML file (`--config`) and overridable by flags.

Every command and recipe parses its settings with `parse_config`, in the style of trl's `TrlParser` and
transformers' `HfArgumentParser` (which it extends): each field of each dataclass is a `--field_name`
(or `--field-name`) flag; a YAML file given with `--config` supplies defaults for any of them, and a
`base: other.yaml` key in it lays the file over another. A field whose metadata holds
`positional=True` is a positional argument instead (`corag index CORPUS`).

One rule decides between the file and the command line: a flag wins over the file's key, and
`--KEY none` (or `null`) unsets a key whose default is None, whatever the file says: with
`configs/sft/smollm2-lora.yaml`, `--chains none --dataset DIR` trains on DIR instead of its chains.

Every mistake is one InputError, which the `corag` command and the recipes print as one line with exit
status 2: an unknown or misspelled flag or config key names the closest known one (`unknown flag
--datset; did you mean --dataset?`), as do flags renamed since an earlier release (RENAMED); argparse's
own errors (a missing or badly typed value) and a dataclass refusing its values come the same way. A flag
is never matched by its prefix: `--lim 3` is an unknown flag (did you mean --limit?), not `--limit 3`.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn, TypeVar, get_origin, overload

import yaml
from transformers import HfArgumentParser

from corag.errors import InputError

T = TypeVar("T")

# Flags and keys renamed since an earlier release, or named otherwise by another command (`corag index`
# and `corag build-examples` call an index folder --index): that name -> the field that takes its place.
RENAMED = {"fmt": "format", "output": "dataset", "index": "retriever"}
UNSET = ("none", "null")  # `--KEY none`: the key's default (None), whatever the config file says


class ConfigParser(HfArgumentParser):
    """HfArgumentParser whose fields may be positional (`metadata={"positional": True}`) and whose errors
    are InputErrors (one line where they are caught), not a usage text and SystemExit. Flags are never
    matched by prefix (`--lim` is not `--limit`): a prefix accepted today would change meaning the day an
    option that shares it is added, so it is an unknown flag like any other."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise InputError(message)

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

    Fields required on the command line are satisfied by the file. Every mistake is an InputError in
    one line (see the module's docstring).
    """
    single = isinstance(classes, type)
    classes = (classes,) if single else tuple(classes)
    values = _parse(classes, argv, description, required=True)
    built = []
    for cls in classes:
        try:
            built.append(cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.init}))
        except InputError:
            raise
        except ValueError as error:  # the dataclass's own check of its values (trl's, transformers')
            raise InputError(str(error)) from None
    return built[0] if single else tuple(built)


def read_config(classes: Iterable[type], argv: list[str]) -> dict[str, Any]:
    """Every field of `classes` as `argv` (`--config FILE` and flags) gives it, refused as parse_config
    refuses (unknown keys, bad values), but neither required nor built into the dataclasses: a stage's
    config read on another machine than the stage's (`corag plan`), where checks of the device do not hold.
    """
    return _parse(tuple(classes), argv, "", required=False)


def _parse(
    classes: tuple[type, ...], argv: list[str] | None, description: str, required: bool
) -> dict[str, Any]:
    """The value of each field of `classes` from the config file and the flags (see parse_config)."""
    pre = ConfigParser(add_help=False)
    pre.add_argument("--config")
    known, rest = pre.parse_known_args(argv)
    parser = ConfigParser(classes, description=description)
    parser.add_argument("--config", help="YAML file of settings (keys: field names); flags override it")
    fields = [f for cls in classes for f in dataclasses.fields(cls) if f.init]
    if known.config:
        values = known_keys(known.config, {f.name for f in fields})
        parser.set_defaults(**values)
        for action in parser._actions:
            if action.dest in values:
                action.required = False
                if not action.option_strings:  # a positional the file supplies may be left out
                    action.nargs = "*" if action.nargs == "+" else "?"
    rest, unset = _unset_flags(parser, rest, {f.name for f in fields if f.default is None})
    needed = [action for action in parser._actions if action.required]
    for action in needed:  # a misspelled flag is named before the flag it leaves missing
        action.required = False
    namespace, extra = parser.parse_known_args(rest)
    if extra:
        _refuse_unknown(parser, extra)
    if needed and required:
        for action in needed:
            action.required = True
        namespace, _ = parser.parse_known_args(rest)  # argparse's check of the required ones
    return {f.name: None if f.name in unset else getattr(namespace, f.name) for f in fields}


def _unset_flags(
    parser: argparse.ArgumentParser, argv: list[str], nullable: set[str]
) -> tuple[list[str], list[str]]:
    """`argv` without its `--KEY none` pairs (KEY a field whose default is None), and those fields."""
    flags = {
        option: action.dest
        for action in parser._actions
        if action.dest in nullable
        for option in action.option_strings
    }
    kept: list[str] = []
    unset: list[str] = []
    words = iter(argv)
    for word in words:
        flag, equals, value = word.partition("=")
        if flag in flags and equals and value.lower() in UNSET:
            unset.append(flags[flag])
        elif word in flags and (following := next(words, None)) is not None:
            if following.lower() in UNSET:
                unset.append(flags[word])
            else:
                kept += [word, following]
        else:
            kept.append(word)
    return kept, unset


def _refuse_unknown(parser: argparse.ArgumentParser, extra: list[str]) -> NoReturn:
    """The first flag argparse did not know, with the closest one it knows (or, without a flag among
    them, the stray values)."""
    flags = [word.partition("=")[0] for word in extra if word.startswith("-") and word != "-"]
    if not flags:
        raise InputError(f"unrecognized arguments: {' '.join(extra)}")
    known = [option for option in parser._option_string_actions if option.startswith("--")]
    close = _closest(flags[0], known, "--")
    raise InputError(f"unknown flag {flags[0]}; " + (f"did you mean {close}?" if close else "see --help"))


def _closest(name: str, known: list[str], prefix: str = "") -> str | None:
    """The known name `name` was renamed to, else the closest of those it is a prefix of, else the
    closest to it (None when none is close)."""
    renamed = prefix + RENAMED.get(name.removeprefix(prefix).replace("-", "_"), "")
    if renamed in known:
        return renamed
    extended = [k for k in known if k.startswith(name)]
    close = difflib.get_close_matches(name, extended, n=1, cutoff=0) or difflib.get_close_matches(
        name, known, n=1
    )
    return close[0] if close else None


def known_keys(path: str, names: set[str]) -> dict[str, Any]:
    """The YAML mapping of config file `path`; a key outside `names` is an InputError naming it and the
    closest known key."""
    values = load_yaml(path)
    for key in values:
        if key not in names:
            close = _closest(str(key), sorted(names))
            hint = f"did you mean {close}?" if close else "see --help"
            raise InputError(f"unknown config key; {hint}", file=path, field=key)
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
