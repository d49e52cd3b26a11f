"""Reading a model's reply: where the answer is."""

from __future__ import annotations

from agentrl.errors import EnvError

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


def question_step(env: str, answer: str | None, action: object) -> tuple[str, str, str]:
    """(right answer, reply, the reply's answer content) for a question env's step: a reply that is
    not a string reads as "", and a step before the first reset (no right answer yet) is an EnvError."""
    if answer is None:
        raise EnvError(f"{env}: step() before reset(); call reset() first")
    reply = action if isinstance(action, str) else ""
    return answer, reply, answer_content(reply)
