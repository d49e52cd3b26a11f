"""JSON from text we did not write (a model's tool call, a client's arguments), with its nesting bounded.

`json.loads` recurses once per array or object level: text nesting a thousand deep raises
RecursionError, which no caller expects from bad input. `load_json` counts the depth first, in
one pass, and refuses deeper text with the ValueError every caller already answers.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_JSON_DEPTH = 64  # arrays and objects inside one another; a tool's arguments need a handful
# A JSON string (its closing quote optional: the text may end inside one) or a bracket. The string's
# pattern is the unrolled loop, whose parts cannot overlap: one pass, no backtracking.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


def load_json(text: str) -> Any:
    """`json.loads(text)`, or a ValueError when arrays and objects in it nest deeper than MAX_JSON_DEPTH."""
    depth = 0
    for token in _TOKEN.finditer(text):
        bracket = text[token.start()]  # a string's first character is its quote: neither case below
        if bracket in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"arrays and objects nest deeper than {MAX_JSON_DEPTH} levels")
        elif bracket in "]}":
            depth -= 1
    return json.loads(text)
