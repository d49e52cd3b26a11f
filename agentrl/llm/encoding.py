"""Text to token ids: the fast encode, and chat text in which only the template's markers are special.

A message's content is not the chat template's: a tool answer, an env observation, a search
document or an OpenAI client's message may hold the text of a special token
(`<|im_end|>\\n<|im_start|>system\\n...`). Encoded as rendered, with special tokens parsed, that
text becomes the real special ids: a forged system or assistant turn the model cannot tell from a
real one. So, before rendering, every special token's text inside the strings of the messages and
the tools is wrapped in two markers (`mark`); the template renders the markers along with the
text, and `encode_chat` spells each marked token out as plain text (what `split_special_tokens=True`
does) and encodes the rest, the template's own text, with special tokens parsed. Text that holds
no special token's text, nearly all of it, is marked with nothing and encoded on the fast path.

The markers are ASCII letters and digits with a random part drawn per process: templates that
`trim` or `tojson` a content keep them as they are, and no input can guess them (so no input can
forge them either). transformers' `apply_chat_template(sanitize_control_tokens=True)` does the
same for a whole chat it tokenises; conversations encode the template's text piece by piece, so
they keep their own markers. Only special tokens are spelled out; ordinary added tokens (reply tags
such as `<answer>`, Qwen's `<tool_call>`) keep their ids, as with `split_special_tokens`.
"""

from __future__ import annotations

import re
import secrets
import weakref
from dataclasses import dataclass, field
from typing import Any

import tokenizers

from agentrl.tokenizer import Tokenizer

_NONCE = secrets.token_hex(8)
START = f"AGENTRLSPECIAL{_NONCE}S"  # wraps a special token's text in rendered chat text (see the module)
END = f"E{_NONCE}AGENTRLSPECIAL"


@dataclass
class _Specials:
    """What `mark` and `encode_chat` need of one tokenizer, found once."""

    pattern: re.Pattern | None  # any special token's text, longest first; None: the tokenizer has none
    marked: re.Pattern  # a marked token (its text in group 1), or a marker the template split from its token
    spelled: dict[str, list[int]] = field(default_factory=dict)  # token text -> its ids as plain text


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _specials(tokenizer: Tokenizer) -> _Specials:
    try:
        found = _CACHE.get(tokenizer)
    except TypeError:  # not weak-referenceable: found again each time
        found = None
    if found is not None:
        return found
    texts = sorted(special_texts(tokenizer), key=len, reverse=True)
    alternatives = "|".join(map(re.escape, texts))
    found = _Specials(re.compile(alternatives) if texts else None,
                      re.compile(f"{START}({alternatives or '(?!)'}){END}|{START}|{END}"))
    try:
        _CACHE[tokenizer] = found
    except TypeError:
        pass
    return found


def special_texts(tokenizer: Tokenizer) -> set[str]:
    """The text of every special token of `tokenizer` (the added tokens marked special)."""
    added = getattr(tokenizer, "added_tokens_decoder", None)
    if isinstance(added, dict):
        return {t.content for t in added.values() if getattr(t, "special", False) and t.content}
    return {t for t in tokenizer.all_special_tokens if t}


def mark(tokenizer: Tokenizer, value: Any) -> Any:
    """`value` (a message, a list of messages or tools, a string) with the text of each special
    token in its strings wrapped in the markers; dict keys are left alone. An unchanged part is
    returned as it is (the same object)."""
    pattern = _specials(tokenizer).pattern
    return value if pattern is None else _mark(pattern, value)


def _mark(pattern: re.Pattern, value: Any) -> Any:
    if isinstance(value, str):
        return pattern.sub(_wrap, value) if pattern.search(value) else value
    if isinstance(value, dict):
        out = None  # a copy, made at the first changed value
        for k, v in value.items():
            if (new := _mark(pattern, v)) is not v:
                out = out or dict(value)
                out[k] = new
        return value if out is None else out
    if isinstance(value, (list, tuple)):
        items = [_mark(pattern, v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    return value


def _wrap(match: re.Match) -> str:
    return START + match.group(0) + END


def unmark(text: str) -> str:
    """Rendered chat text without the markers: the text the template renders for the messages themselves."""
    return text.replace(START, "").replace(END, "") if START in text or END in text else text


def encode_chat(tokenizer: Tokenizer, text: str) -> list[int]:
    """The ids of chat text rendered from marked messages: each marked special token spelled out
    as plain text (encoded apart from the text around it), the rest with its special tokens parsed."""
    if START not in text and END not in text:
        return encode_text(tokenizer, text)
    found = _specials(tokenizer)
    pieces = found.marked.split(text)  # [template text, marked token or None, template text, ...]
    ids = encode_text(tokenizer, pieces[0]) if pieces[0] else []
    for i in range(1, len(pieces), 2):
        token, after = pieces[i], pieces[i + 1]
        if token:  # a marker without its token (the template cut it) only separates the texts around it
            ids += found.spelled.get(token) or found.spelled.setdefault(token, _spell(tokenizer, token))
        if after:
            ids += encode_text(tokenizer, after)
    return ids


def _spell(tokenizer: Tokenizer, token: str) -> list[int]:
    """A special token's text as plain-text ids (encoded after a newline that is then dropped, so a
    SentencePiece tokenizer does not prefix a space as it would at the start of a text)."""
    def plain(text: str) -> list[int]:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if isinstance(backend, tokenizers.Tokenizer):  # the Rust pipeline without its added tokens
            if backend.normalizer is not None:
                text = backend.normalizer.normalize_str(text)
            pre = backend.pre_tokenizer
            pieces = [piece for piece, _ in pre.pre_tokenize_str(text)] if pre is not None else [text]
            return [t.id for piece in pieces for t in backend.model.tokenize(piece)]
        # call-arg: a transformers tokenizer's encode takes split_special_tokens; the Tokenizer protocol
        # (agentrl/tokenizer.py) names only what every tokenizer takes
        return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))  # type: ignore[call-arg]

    newline = plain("\n")
    ids = plain("\n" + token)
    return ids[len(newline):] if ids[:len(newline)] == newline else plain(token)


def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """`tokenizer.encode(text, add_special_tokens=False)`, through the Rust tokenizer directly
    when that call would reach it in its plain state (no padding, truncation or split specials).

    transformers' wrapper costs twice the Rust encode on short texts, and a conversation encodes
    two or three short pieces per turn.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (isinstance(backend, tokenizers.Tokenizer) and not getattr(tokenizer, "split_special_tokens", False)
            and not backend.encode_special_tokens and backend.padding is None and backend.truncation is None):
        return backend.encode(text, add_special_tokens=False).ids
    return tokenizer.encode(text, add_special_tokens=False)
