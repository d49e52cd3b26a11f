"""An OpenEnv server's action schema (`GET /schema`) as a reply format: parsing, sampling, the format line.

The server's action is a Pydantic model; its JSON schema names the fields the model must fill,
their types, enums and bounds. `ActionFields` reads that schema once and turns a reply into the
action's fields (or a one-line reason why it cannot), draws uniformly random valid replies
(`sample_action`, the warm start's format lesson and the random reference) and writes the line of
the instructions that says what a reply looks like. Plain functions and one small class: no network.

A reply's answer is the content of its last `<answer>...</answer>` (or the whole reply): a JSON
object of the fields; or, for an action of one field, the value alone (`<answer>7</answer>`); or the
required fields' values in the schema's order, separated by spaces (`<answer>up 2</answer>`, the
form `sample_action` writes and the instructions show: short, for small models); or `name=value`
pairs separated by `;` or new lines (`<answer>direction=up; steps=2</answer>`).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from typing import Any

from agentrl.bounded_json import load_json
from agentrl.envs.text import answer_content

SCAN_LIMIT = 4096  # an answer longer than this is not an action; the cap keeps parsing cheap
SKIPPED = ("metadata",)  # OpenEnv's Action base field: a dict with a default, never the model's to write
_PAIR = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*[=:]\s*(.*?)\s*$", re.DOTALL)
_INT = re.compile(r"[+-]?\d{1,18}")
_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")
WORDS = ("a", "b", "yes", "no", "go", "up", "ok")  # a free string field's random values (format only)
NUMBER_SPAN = 10  # an unbounded number is sampled within this many units of its one bound (or of 0)


@dataclass(frozen=True)
class Field:
    """One field of the action: its name, JSON type, allowed values and bounds, and whether it is required."""

    name: str
    kind: str  # string, integer, number, boolean, or json (arrays and objects: written as JSON)
    required: bool
    enum: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    nullable: bool = False
    description: str = ""

    def describe(self) -> str:
        """`name (integer 1..2, the description)` for the instructions."""
        if self.enum is not None:
            what = " | ".join(str(v) for v in self.enum)
        elif self.low is not None or self.high is not None:
            lo = "" if self.low is None else f"{self.low:g}"
            hi = "" if self.high is None else f"{self.high:g}"
            what = f"{self.kind} {lo}..{hi}"
        else:
            what = self.kind
        extra = f", {self.description}" if self.description else ""
        return f"{self.name} ({what}{'' if self.required else ', optional'}{extra})"


class ActionFields:
    """The fields of an OpenEnv action schema, and replies parsed into them."""

    def __init__(self, schema: dict[str, Any]) -> None:
        if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
            raise ValueError("the action schema has no 'properties' (expected a Pydantic model's JSON schema)")
        defs = schema.get("$defs", {}) if isinstance(schema.get("$defs"), dict) else {}
        required = set(schema.get("required", ()) or ())
        self.fields = tuple(_field(name, prop, name in required, defs)
                            for name, prop in schema["properties"].items()
                            if name not in SKIPPED and isinstance(prop, dict))
        if not self.fields:
            raise ValueError("the action schema has no field a reply could fill")
        self.by_name = {f.name: f for f in self.fields}
        self.single = self.fields[0] if len(self.fields) == 1 else None
        self.positional = tuple(f.name for f in self.fields if f.required)

    def format_line(self) -> str:
        """What a reply looks like, for the instructions."""
        fields = "; ".join(f.describe() for f in self.fields)
        if self.single is not None:
            return f"Reply with the action's {fields} as <answer>value</answer>."
        if self.positional:
            example = self.reply(self.sample(random.Random(0)))
            return (f"Reply with the action's fields {fields} as <answer>{' '.join(self.positional)}</answer>, "
                    f"e.g. {example}.")
        return f"Reply with the action's fields {fields} as <answer>name=value; name=value</answer>."

    def parse(self, reply: str) -> tuple[dict[str, Any] | None, str]:
        """(the action's fields, "") from a reply, or (None, why it is not an action)."""
        if not isinstance(reply, str):
            return None, "the reply is not text"
        content = answer_content(reply).strip()
        if not content:
            return None, "the answer is empty"
        if len(content) > SCAN_LIMIT:
            return None, f"the answer is longer than {SCAN_LIMIT} characters"
        raw = self._raw_values(content)
        if isinstance(raw, str):
            return None, raw
        out: dict[str, Any] = {}
        for name, text in raw.items():
            field = self.by_name.get(name)
            if field is None:
                return None, f"{name!r} is not a field of the action (fields: {', '.join(self.by_name)})"
            value, problem = coerce(field, text)
            if problem:
                return None, problem
            out[name] = value
        missing = [f.name for f in self.fields if f.required and f.name not in out]
        if missing:
            return None, f"missing field {missing[0]!r}"
        return out, ""

    def _raw_values(self, content: str) -> dict[str, Any] | str:
        """{name: value as written} from an answer, or why it cannot be read."""
        if content.startswith("{"):
            try:
                data = load_json(content)
            except (ValueError, RecursionError):
                return "the answer starts with '{' but is not a JSON object"
            return data if isinstance(data, dict) else "the answer is not a JSON object"
        parts = [p for p in re.split(r"[;\n]", content) if p.strip()]
        pairs = [_PAIR.match(p) for p in parts]
        if all(pairs) and all(m.group(1) in self.by_name for m in pairs if m):
            return {m.group(1): m.group(2) for m in pairs if m}
        if self.single is not None:
            return {self.single.name: content}
        words = content.split()
        if self.positional and len(words) == len(self.positional):
            return dict(zip(self.positional, words))
        order = " ".join(self.positional) or "name=value; name=value"
        return f"write the fields as {order}"

    def sample(self, rng: random.Random) -> dict[str, Any]:
        """A uniformly random valid value of every required field (and of none of the optional ones)."""
        return {f.name: sample_value(f, rng) for f in self.fields if f.required or self.single is f}

    def reply(self, values: dict[str, Any]) -> str:
        """The reply that `parse` reads back as `values`, in the format the instructions show."""
        if self.single is not None and set(values) == {self.single.name}:
            return f"<answer>{_written(values[self.single.name])}</answer>"
        written = {k: _written(v) for k, v in values.items()}
        if tuple(written) == self.positional and all(w and len(w.split()) == 1 for w in written.values()):
            return "<answer>" + " ".join(written.values()) + "</answer>"
        return "<answer>" + "; ".join(f"{k}={w}" for k, w in written.items()) + "</answer>"


def _written(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value)


def _field(name: str, prop: dict[str, Any], required: bool, defs: dict[str, Any]) -> Field:
    """A Field from one property of the schema (references and Optional's anyOf-with-null resolved)."""
    prop = _resolved(prop, defs)
    nullable = False
    options = prop.get("anyOf") or prop.get("oneOf")
    if isinstance(options, list):
        kept = [_resolved(o, defs) for o in options if isinstance(o, dict) and o.get("type") != "null"]
        nullable = len(kept) < len(options)
        if len(kept) == 1:
            prop = {**prop, **kept[0]}
    enum = prop.get("enum")
    if "const" in prop:
        enum = [prop["const"]]
    kind = str(prop["type"]) if prop.get("type") in ("string", "integer", "number", "boolean") else "json"
    if enum is not None and kind == "json":
        kind = "string" if all(isinstance(v, str) for v in enum) else "json"
    low = prop.get("minimum", prop.get("exclusiveMinimum"))
    high = prop.get("maximum", prop.get("exclusiveMaximum"))
    if kind == "integer":  # exclusive bounds of integers as inclusive ones
        low = low + 1 if "minimum" not in prop and low is not None else low
        high = high - 1 if "maximum" not in prop and high is not None else high
    return Field(name=name, kind=kind, required=required, enum=tuple(enum) if isinstance(enum, list) else None,
                 low=float(low) if isinstance(low, (int, float)) else None,
                 high=float(high) if isinstance(high, (int, float)) else None,
                 nullable=nullable, description=str(prop.get("description", "")).strip())


def _resolved(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = prop.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = defs.get(ref.split("/")[-1])
        if isinstance(target, dict):
            return {**target, **{k: v for k, v in prop.items() if k != "$ref"}}
    return prop


def coerce(field: Field, value: Any) -> tuple[Any, str]:
    """(the field's value, "") from what the reply wrote (text, or a JSON value), or (None, why not)."""
    text = value.strip() if isinstance(value, str) else None
    if field.nullable and (value is None or (text or "").lower() in ("null", "none")):
        return None, ""
    if field.enum is not None:
        for allowed in field.enum:
            if value == allowed or (text is not None and text.lower() == str(allowed).lower()):
                return allowed, ""
        return None, f"{field.name}={_shown(value)} is not one of {', '.join(str(v) for v in field.enum)}"
    if field.kind == "string":
        return (value, "") if isinstance(value, str) else (None, f"{field.name} must be text")
    if field.kind == "boolean":
        if isinstance(value, bool):
            return value, ""
        word = (text or "").lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE, ""
        return None, f"{field.name}={_shown(value)} is not true or false"
    if field.kind in ("integer", "number"):
        number = _number(field, value, text)
        if number is None:
            what = "an integer" if field.kind == "integer" else "a number"
            return None, f"{field.name}={_shown(value)} is not {what}"
        if (field.low is not None and number < field.low) or (field.high is not None and number > field.high):
            return None, f"{field.name}={_shown(value)} is out of range ({field.describe()})"
        return number, ""
    if text is None:
        return value, ""  # a JSON object's own nested value
    try:
        return load_json(text), ""
    except (ValueError, RecursionError):
        return None, f"{field.name} must be JSON"


def _number(field: Field, value: Any, text: str | None) -> int | float | None:
    if isinstance(value, bool):
        return None
    if field.kind == "integer":
        if isinstance(value, int):
            return value
        return int(text) if text is not None and _INT.fullmatch(text) else None
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else None
    try:
        number = float(text) if text is not None and len(text) <= 32 else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) else None


def sample_value(field: Field, rng: random.Random) -> Any:
    """A uniformly random valid value of `field` (a free string or JSON field: a short word or {})."""
    if field.enum is not None:
        return rng.choice(field.enum)
    if field.kind == "boolean":
        return rng.random() < 0.5
    if field.kind in ("integer", "number"):
        low = field.low if field.low is not None else (field.high - NUMBER_SPAN if field.high is not None else 0)
        high = field.high if field.high is not None else low + NUMBER_SPAN
        if field.kind == "integer":
            return rng.randint(math.ceil(low), math.floor(high))
        return round(rng.uniform(low, high), 2)
    if field.kind == "string":
        return rng.choice(WORDS)
    return {}


def render_observation(observation: dict[str, Any]) -> str:
    """An observation's fields as `name: value` lines (text as it is, other values as JSON; None left out)."""
    lines = []
    for name, value in observation.items():
        if value is None:
            continue
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        lines.append(f"{name}: {shown}")
    return "\n".join(lines)


def _shown(value: Any, limit: int = 40) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return repr(text if len(text) <= limit else text[:limit] + "...")
