"""Finds the cached sequence that shares the longest prefix with a new prompt.

Sequences register chained hashes of their full blocks of token ids (as vLLM's prefix cache
does); a prompt walks its own block hashes until one misses, then the candidates at the
deepest hit are compared id by id (which also guards against hash collisions). Python hashes
tuples of ints the same way in every run, so the choice is deterministic.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

BLOCK = 16


class HasTokens(Protocol):
    """What the index needs of a sequence: its ids and its registered block hashes."""

    tokens: list[int]
    block_hashes: list[int]


S = TypeVar("S", bound=HasTokens)


class PrefixIndex(Generic[S]):
    """Block-hash index over the token ids of cached sequences (of type `S`, which `walk` returns)."""

    def __init__(self) -> None:
        self._by_hash: dict[int, list[S]] = {}

    def add(self, seq: S) -> None:
        """Register the full blocks of `seq.tokens` not registered yet."""
        hashes = seq.block_hashes
        h = hashes[-1] if hashes else 0
        for b in range(len(hashes), len(seq.tokens) // BLOCK):
            h = hash((h, *seq.tokens[b * BLOCK:(b + 1) * BLOCK]))
            hashes.append(h)
            self._by_hash.setdefault(h, []).append(seq)

    def remove(self, seq: S) -> None:
        """Forget `seq` (it was freed)."""
        for h in seq.block_hashes:
            seqs = self._by_hash.get(h)
            if seqs is not None:
                seqs.remove(seq)
                if not seqs:
                    del self._by_hash[h]
        seq.block_hashes.clear()

    def walk(self, prompt: list[int]) -> list[list[S]]:
        """For each leading block of `prompt` that some sequence shares, the sequences that
        share it (shallowest first); stops at the first block nobody shares."""
        h = 0
        levels: list[list[S]] = []
        for b in range(len(prompt) // BLOCK):
            h = hash((h, *prompt[b * BLOCK:(b + 1) * BLOCK]))
            seqs = self._by_hash.get(h)
            if not seqs:
                break
            levels.append(seqs)
        return levels

    def __len__(self) -> int:
        return len(self._by_hash)


def common_prefix(a: list[int], b: list[int], start: int = 0) -> int:
    """Length of the common prefix of `a` and `b`, knowing the first `start` ids agree."""
    n = min(len(a), len(b))
    i = start
    while i < n and a[i] == b[i]:
        i += 1
    return i
