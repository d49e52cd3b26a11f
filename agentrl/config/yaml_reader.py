"""YAML in, for the config: a file or an override's value, read with one-line errors (a missing
file, bad syntax, not UTF-8) and refusing what no config needs: a key given twice in one
mapping, nesting beyond YAML_MAX_DEPTH, aliases that expand beyond YAML_MAX_VALUES."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agentrl.config.paths import user_path
from agentrl.errors import SHOWN_MAX, ConfigError, shown


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
        raise ConfigError(f"{source}: the YAML holds a value it cannot read: "
                          f"{str(e).splitlines()[0][:SHOWN_MAX]}") from None
