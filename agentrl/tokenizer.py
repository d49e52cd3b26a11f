"""The tokenizer as agentrl uses it: a structural type that a transformers tokenizer already is.

Agents render chat messages and encode text with it, the trainer pads and decodes with its special
ids, checkpoints and the embedded model's cache save it. Anything with these members works (a
`transformers.PreTrainedTokenizerBase` does). Imports nothing of the package, so every layer
(agents, rollout, train, models, llm) may name it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """What the package reads and calls on a tokenizer; ids are `int`, texts `str`."""

    name_or_path: str  # its folder (seed agents load it from there), or a hub name
    chat_template: str | None  # Jinja template that renders a list of chat messages
    eos_token: str | None
    pad_token: str | None  # set to eos_token where a tokenizer ships without one
    # With the vocabulary, what the embedded model's cache key hashes; and the texts spelled out as
    # plain text inside messages (llm/encoding.py), or those of `added_tokens_decoder`'s special
    # tokens where the tokenizer has one (a transformers tokenizer does).
    all_special_tokens: list[str]

    @property
    def eos_token_id(self) -> int | None:
        """The id that ends a reply (every agent stops on it)."""

    @property
    def pad_token_id(self) -> int | None:
        """The id that pads a batch's rows (never trained: loss mask 0)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of `text` (agentrl always passes add_special_tokens=False)."""

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of `token_ids`."""

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> Any:
        """Render chat messages (agentrl passes tokenize=False and gets the text)."""

    def get_vocab(self) -> dict[str, int]:
        """Token text -> id, added tokens included."""

    def save_pretrained(self, save_directory: str | os.PathLike[str]) -> Any:
        """Write the tokenizer's files into a folder (checkpoints, the embedded model's cache)."""

    def __len__(self) -> int:
        """The vocabulary size, added tokens included."""
