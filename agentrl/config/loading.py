"""Typed dataclass configs from YAML and `key=value` overrides: parsing, type checks, docs.

Generic machinery under `agentrl.config` (which holds the schema and its validation): a YAML
mapping or an override sets dataclass fields by dotted key, each value is checked against the
field's type (int, float, bool, str, Optional, Literal, list, dict, nested sections, named
sections `dict[str, Section]`), and an unknown key fails with the closest valid one.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from agentrl.config.paths import user_path
from agentrl.errors import SHOWN_MAX, ConfigError, did_you_mean, shown


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with one-line errors for a missing file or bad syntax."""
    p = user_path(str(path), "config file")  # ~ expanded; a name no file system takes is one line
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p} is not a UTF-8 text file (byte {e.start} is {e.object[e.start:e.start + 1]!r}); "
                          "give a YAML config file") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {p}: {e.strerror or e}") from None
    try:
        data = load_yaml(text, str(p))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"YAML syntax error in {p}{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping of config keys, got {type(data).__name__}")
    return data


# A config is a few hundred values a few levels deep. These bounds stop what no config needs: an
# alias bomb (600 bytes whose aliases expand to billions of values, which any error line quoting
# them would print) and nesting deep enough to exhaust Python's recursion.
YAML_MAX_DEPTH = 64
YAML_MAX_VALUES = 100_000  # counting each use of an alias as the values it names


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that rejects a key given twice in one mapping (plain YAML keeps the last),
    nesting deeper than YAML_MAX_DEPTH and aliases that expand beyond YAML_MAX_VALUES values."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > YAML_MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YamlLimitError(f"nests deeper than {YAML_MAX_DEPTH} levels (line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self) -> Any:
        node = super().get_single_node()
        if node is not None:
            _expanded_size(node, {}, set())
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *base' may be overridden key by key
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first is not key_node.start_mark:
                raise DuplicateKeyError(key, first, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    """Values under `node` with every alias expanded (each node counted once per use), raising
    YamlLimitError beyond YAML_MAX_VALUES or on an alias inside what it names."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise YamlLimitError("holds an alias inside the value it names (an endless value)")
    open_.add(key)
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(child, sizes, open_) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, sizes, open_) + _expanded_size(v, sizes, open_) for k, v in node.value)
    if size > YAML_MAX_VALUES:
        raise YamlLimitError(f"expands to more than {YAML_MAX_VALUES} values (each use of an alias repeats "
                             "what it names); write the values out or use fewer aliases")
    open_.discard(key)
    sizes[key] = size
    return size


class YamlLimitError(yaml.YAMLError):
    """A YAML document beyond what a config needs: too deep, or aliases that expand too far."""


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names the same key twice."""

    def __init__(self, key: Any, first: yaml.Mark, again: yaml.Mark) -> None:
        super().__init__(f"key {shown(key)} is given twice (lines {first.line + 1} and {again.line + 1})")
        self.key, self.first, self.again = key, first, again


def load_yaml(text: str, source: str = "<string>") -> Any:
    """yaml.safe_load, except that a key given twice in one mapping is an error."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except DuplicateKeyError as e:
        raise ConfigError(f"{source}: {e}; give each key once") from None
    except YamlLimitError as e:
        raise ConfigError(f"{source}: the YAML {e}") from None
    except ValueError as e:  # a value YAML's constructors cannot make: 5000 digits, a 13th month
        raise ConfigError(f"{source}: the YAML holds a value it cannot read: {str(e).splitlines()[0][:SHOWN_MAX]}") from None


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
        valid = [prefix + name for name in fields]
        hint = did_you_mean(full, _all_keys(type(obj), prefix)) or did_you_mean(full, valid)
        raise ConfigError(f"unknown config key {shown(prefix + dotted)}.{hint}")
    hint_type = _field_types(type(obj))[head]
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


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass of an Optional[section] or dict[str, section] type, else None."""
    origin = typing.get_origin(tp)
    if origin is dict:
        args = typing.get_args(tp)
        return args[1] if len(args) == 2 and dataclasses.is_dataclass(args[1]) else None
    if origin is typing.Union or origin is types.UnionType:
        found = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        return found[0] if found else None
    return None


def coerce(value: Any, tp: Any, name: str) -> Any:
    """Check `value` against type `tp` (int, float, bool, str, Optional, Literal, list, dict)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
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
        if dataclasses.is_dataclass(tp):
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
        body = ast.parse(inspect.getsource(klass)).body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant):
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
