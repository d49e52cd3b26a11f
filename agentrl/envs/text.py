"""Reading a model's reply: where the answer is."""

from __future__ import annotations

OPEN, CLOSE = "<answer>", "</answer>"


def answer_content(text: str) -> str:
    """The content of the last `<answer>...</answer>`, else of an unclosed last `<answer>` (a reply
    cut off inside its answer), else the whole text. Tags match exactly: lower-case the text
    first for case-insensitive tags."""
    close = text.rfind(CLOSE)
    if close != -1:
        start = text.rfind(OPEN, 0, close)
        if start != -1:
            return text[start + len(OPEN): close]
    start = text.rfind(OPEN)
    if start != -1 and text.find(CLOSE, start) == -1:
        return text[start + len(OPEN):]
    return text
