"""Loading the config: the dataclass defaults, a YAML file, then `key=value` overrides, every value
checked against its field's type, then every check (checks.py) and what other fields imply
(`resolve`); saving it; the fields' docs (`agentrl train --help`).

The machinery is generic over typed dataclasses: a YAML mapping or an override sets fields by
dotted key, each value checked against the field's type (int, float, bool, str, Optional,
Literal, list, dict, nested sections, named sections `dict[str, Section]`), and an unknown key
fails in one line with the closest valid one: the same name in another section first (a key
that moved, e.g. rollout.max_num_seqs is engine.max_num_seqs), else the closest key.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeGuard

import yaml

from agentrl.atomic import write_atomic
from agentrl.config.checks import validate
from agentrl.config.paths import expand_paths
from agentrl.config.schema import Config
from agentrl.config.yaml_reader import load_yaml, read_yaml
from agentrl.errors import ConfigError, did_you_mean, shown


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Build a Config from defaults, an optional YAML file, then `key=value` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        data = read_yaml(path)
    cfg = from_dict(Config, data, prefix="")
    for item in overrides:
        key, value = parse_override(item)
        set_path(cfg, key, value)
    validate(cfg)
    resolve(cfg)
    return cfg


def resolve(cfg: Config) -> None:
    """Set what other fields imply, so the saved config says what the run does."""
    expand_paths(cfg)
    r, a = cfg.rollout, cfg.actor
    if r.max_staleness > 0 and r.stale_samples == "correct" and a.tis_imp_ratio_cap <= 0:
        a.use_decoupled_loss = True  # stale samples need an off-policy correction


def all_keys() -> list[str]:
    """Every valid dotted config key."""
    return _all_keys(Config)


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain nested dicts (for YAML and hashing)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML (whole or not at all: a resume rewrites it and reads it back)."""
    write_atomic(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


def field_docs(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, doc) for every field, read from the docstrings below the fields."""
    return dataclass_docs(cls, prefix)


def parse_override(item: str) -> tuple[str, Any]:
    """Split 'a.b=value' and parse the value as YAML (so 3 is int, true is bool, [1,2] a list)."""
    key, sep, raw = item.partition("=")
    key = key.strip().lstrip("+")
    if not sep or not key:
        raise ConfigError(f"override '{item}' must look like key=value, e.g. trainer.total_steps=20")
    try:
        value = load_yaml(raw, f"override {shown(item)}") if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def from_dict(cls: type, data: dict[str, Any], prefix: str) -> Any:
    """Build dataclass `cls` from a nested dict, checking every key and type."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {shown(data)}")
    obj = cls()
    for key, value in data.items():
        set_path(obj, f"{key}", value, prefix=prefix)
    return obj


def set_path(obj: Any, dotted: str, value: Any, prefix: str = "") -> None:
    """Set `obj.a.b = value` with type checking; unknown keys suggest the closest valid key."""
    head, _, rest = dotted.partition(".")
    full = prefix + head
    fields = {f.name: f for f in dataclasses.fields(obj)}
    if head not in fields:
        raise ConfigError(f"unknown config key {shown(prefix + dotted)}.{_closest(full, type(obj), prefix)}")
    section_type: type = type(obj)
    hint_type = _field_types(section_type)[head]
    current = getattr(obj, head)
    if dataclasses.is_dataclass(current):
        if rest:
            set_path(current, rest, value, prefix=full + ".")
        else:
            setattr(obj, head, from_dict(type(current), value, prefix=full + "."))
        return
    if rest:
        entry_tp = _dataclass_in(hint_type)
        if isinstance(current, dict) and entry_tp is not None:  # named sections (custom_envs.<name>.…)
            name, _, sub = rest.partition(".")
            entry = current.get(name)
            if sub:
                entry = entry if entry is not None else entry_tp()
                set_path(entry, sub, value, prefix=f"{full}.{name}.")
            else:
                entry = coerce(value, entry_tp, f"{full}.{name}")
            setattr(obj, head, {**current, name: entry})
            return
        if isinstance(current, dict):  # free-form dicts (env.args) accept any nested key
            new = dict(current)
            _set_nested(new, rest, value)
            setattr(obj, head, new)
            return
        if current is None and entry_tp is not None:  # an optional section set key by key
            section = entry_tp()
            set_path(section, rest, value, prefix=full + ".")
            setattr(obj, head, section)
            return
        raise ConfigError(f"config key '{full}' is a {_type_name(hint_type)}, it has no field '{rest}'")
    setattr(obj, head, coerce(value, hint_type, full))


def _closest(key: str, section: type, prefix: str) -> str:
    """' Did you mean ...?' for an unknown `key` of `section`: the same field name in another
    section of the schema (a key that moved), else the closest key of the section."""
    name = key.rpartition(".")[2]
    elsewhere = [k for k in _all_keys(Config) if k.rpartition(".")[2] == name]
    if elsewhere:
        return did_you_mean(key, elsewhere) or f" Did you mean {shown(elsewhere[0])}?"
    return (did_you_mean(key, _all_keys(section, prefix))
            or did_you_mean(key, [prefix + f.name for f in dataclasses.fields(section)]))


def _is_section(tp: Any) -> TypeGuard[type]:
    """Whether the type hint `tp` is a dataclass (a config section); never true of an instance."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass of an Optional[section] or dict[str, section] type, else None."""
    origin = typing.get_origin(tp)
    if origin is dict:
        args = typing.get_args(tp)
        return args[1] if len(args) == 2 and _is_section(args[1]) else None
    if origin is typing.Union or origin is types.UnionType:
        found = [a for a in typing.get_args(tp) if _is_section(a)]
        return found[0] if found else None
    return None


def coerce(value: Any, tp: Any, name: str) -> Any:
    """Check `value` against type `tp` (int, float, bool, str, Optional, Literal, list, dict)."""
    origin = typing.get_origin(tp)
    if _is_section(tp):
        return from_dict(tp, value, prefix=name + ".")
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        section = _dataclass_in(tp)
        if section is not None and isinstance(value, dict):  # keep the section's own key errors
            return from_dict(section, value, prefix=name + ".")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, name)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{name}={shown(value)} is not a {_type_name(tp)}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            choices = ", ".join(repr(a) for a in allowed)
            hint = did_you_mean(str(value), [str(a) for a in allowed])
            raise ConfigError(f"{name}={shown(value)} is not allowed; choose one of {choices}.{hint}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}={shown(value)} must be a list")
        (item_tp,) = typing.get_args(tp)[:1] or (Any,)
        return [coerce(v, item_tp, f"{name}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{name}={shown(value)} must be a mapping")
        section = _dataclass_in(tp)
        if section is None:
            return dict(value)
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise ConfigError(f"{name}: names must be strings, got {shown(bad[0])}")
        return {k: coerce(v if v is not None else {}, section, f"{name}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}={shown(value)} must be true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{name}={shown(value)} must be an integer")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an int beyond the float range
                number = math.inf
        elif isinstance(value, str):  # YAML 1.1 reads '1e-3' (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise ConfigError(f"{name}={shown(value)} must be a number")
        if not math.isfinite(number):  # nan/inf (or 1e400) would turn weights or losses into NaN
            raise ConfigError(f"{name}={shown(value)} must be a finite number")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{name}={shown(value)} must be a string")
    raise AssertionError(f"config field {name} has an unsupported type {tp!r}")


def _set_nested(d: dict, dotted: str, value: Any) -> None:
    head, _, rest = dotted.partition(".")
    if rest:
        sub = dict(d.get(head) or {})
        _set_nested(sub, rest, value)
        d[head] = sub
    else:
        d[head] = value


@functools.cache  # a class's hints never change, and resolving them is most of a config load's time
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return {int: "integer", float: "number", bool: "boolean", str: "string",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key under `cls`, for suggestions."""
    keys = []
    for f in dataclasses.fields(cls):
        tp = _field_types(cls)[f.name]
        if _is_section(tp):
            keys.extend(_all_keys(tp, prefix + f.name + "."))
        else:
            keys.append(prefix + f.name)
    return keys


def dataclass_docs(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, doc) for every field, read from the docstrings below the fields."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):  # inherited fields too
        # attr-defined: body[0] is typed as any statement; the source of a class is a ClassDef
        body = ast.parse(inspect.getsource(klass)).body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                    docs[node.target.id] = " ".join(str(nxt.value.value).split())  # one line of help
    rows = []
    default = cls()
    for f in dataclasses.fields(cls):
        value = getattr(default, f.name)
        if dataclasses.is_dataclass(value):
            rows.extend(dataclass_docs(type(value), prefix + f.name + "."))
        else:
            rows.append((prefix + f.name, repr(value), docs.get(f.name, "")))
    return rows
