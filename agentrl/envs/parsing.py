"""Reading a move out of a model's free-text reply, shared by the grid envs.

The move is read from the content of the last `<answer>...</answer>` (or of an unclosed
`<answer>` tail, a reply cut off inside its answer), or else from the whole reply, case
insensitive: one of the words Left, Down, Right, Up, an arrow (← ↓ → ↑), or a lone letter
L/D/R/U. A reply naming two different directions, or none, names no move.
"""

from __future__ import annotations

import re

from agentrl.envs.text import answer_content

DIRECTIONS = ("Left", "Down", "Right", "Up")  # the order is Gymnasium FrozenLake's action ids
_WORDS = {"left": 0, "down": 1, "right": 2, "up": 3, "←": 0, "↓": 1, "→": 2, "↑": 3}
_LETTERS = {"l": 0, "d": 1, "r": 2, "u": 3}
_TOKEN_RE = re.compile(r"\b(?:left|down|right|up)\b|[←↓→↑]")
SCAN_LIMIT = 4096  # an answer longer than this is not a move; the cap keeps parsing cheap


def parse_direction(reply: str) -> int | None:
    """Index into DIRECTIONS of the one direction `reply` names, or None."""
    if not isinstance(reply, str):
        return None
    content = answer_content(reply.lower())[:SCAN_LIMIT]
    letter = content.strip().rstrip(".!")
    if letter in _LETTERS:
        return _LETTERS[letter]
    found = {_WORDS[m.group(0)] for m in _TOKEN_RE.finditer(content)}
    return found.pop() if len(found) == 1 else None
