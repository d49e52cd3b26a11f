"""Which sequences run at the next engine step, and where their KV lives.

A request becomes a `Sequence` that owns one row of the slot KV cache. Between the turns of an
episode its sequence is *parked*: the KV of everything it has seen stays in the row, and when
the episode's next prompt extends it, the new request takes the row over and only the new ids
are prefilled. A prompt that shares a prefix with another cached sequence (the `n` samples of
a GRPO group share their first prompt) gets a new row whose prefix is copied from that one.

Admission is first come, first served and bounded: at most `max_num_seqs` running sequences,
and at most `max_total_tokens` cached tokens, counting each running sequence at its full
reserved length (prompt + max new tokens) and each parked one at its length. Parked sequences
are evicted least recently used first; a request that still does not fit waits in the queue.
Nothing here depends on time: the same calls in the same order give the same schedule.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import EngineError
from agentrl.llm.engine import SamplingParams
from agentrl.llm.kv_cache import SlotKVCache
from agentrl.llm.prefix_index import PrefixIndex, common_prefix


@dataclass(eq=False)
class Request:
    """One `generate` call and what it has produced so far."""

    prompt: list[int]
    sampling: SamplingParams
    max_new: int  # max_new_tokens, clamped so the sequence fits the context
    rng: random.Random
    future: Any = None  # asyncio.Future resolved with the Completion
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str | None = None
    stop_reason: int | str | None = None
    aborted: bool = False
    reused: int = 0  # prompt ids served from the cache
    seq: "Sequence | None" = None

    @property
    def reserved(self) -> int:
        """Tokens this request may occupy at most."""
        return len(self.prompt) + self.max_new


@dataclass(eq=False)
class Sequence:
    """Token ids whose keys/values are (partly) cached in one row."""

    tokens: list[int]
    row: int
    cached: int = 0  # leading ids whose KV is in the row
    request: Request | None = None  # None while parked
    fork_from: "tuple[Sequence, int] | None" = None  # copy this many positions of that sequence first
    kv_version: int = 0  # oldest weights version among the cached KV
    last_used: int = 0
    admitted: int = 0  # admission order, for fair chunked prefill
    block_hashes: list[int] = field(default_factory=list)

    @property
    def uncached(self) -> int:
        """Ids still to run through the model."""
        return len(self.tokens) - self.cached

    @property
    def footprint(self) -> int:
        """Tokens this sequence counts against the KV budget."""
        return self.request.reserved if self.request is not None else len(self.tokens)


class Scheduler:
    """Queue, admission, prefix matching, eviction and rows of the slot cache."""

    def __init__(self, cache: SlotKVCache, *, max_num_seqs: int, max_total_tokens: int,
                 enable_prefix_caching: bool = True) -> None:
        self.cache = cache
        self.max_num_seqs = max_num_seqs
        self.max_total_tokens = max_total_tokens
        self.enable_prefix_caching = enable_prefix_caching
        self.waiting: deque[Request] = deque()
        self.active: list[Sequence] = []  # in admission order
        self.parked: dict[Sequence, None] = {}  # least recently used first
        self.rows: list[Sequence | None] = []
        self.index = PrefixIndex()
        self.clock = 0  # admissions and finishes so far, for LRU order
        self.evictions = 0

    # ------------------------------------------------------------------ accounting
    def used_tokens(self) -> int:
        """Tokens counted against `max_total_tokens` now."""
        return sum(s.footprint for s in self.active) + sum(len(s.tokens) for s in self.parked)

    def has_work(self) -> bool:
        """Whether any request waits or runs."""
        return bool(self.waiting or self.active)

    # ------------------------------------------------------------------ admission
    def admit(self, version: int) -> list[Request]:
        """Move waiting requests into rows while the bounds allow; returns those that can never fit."""
        rejected = []
        while self.waiting and len(self.active) < self.max_num_seqs:
            req = self.waiting[0]
            if req.reserved > self.max_total_tokens:
                rejected.append(self.waiting.popleft())
                continue
            source, shared = self._match(req.prompt) if self.enable_prefix_caching else (None, 0)
            takeover = source is not None and source.request is None and shared == len(source.tokens)
            extra = req.reserved - (len(source.tokens) if takeover else 0)
            keep = {source} if source is not None else set()
            while self.used_tokens() + extra > self.max_total_tokens and self._evict_one(keep):
                pass
            if self.used_tokens() + extra > self.max_total_tokens:
                break  # wait for running sequences to finish
            self.waiting.popleft()
            self._start(req, source if takeover else None, (source, shared) if not takeover else None, version)
        return rejected

    def _match(self, prompt: list[int]) -> tuple[Sequence | None, int]:
        """The cached sequence sharing the longest prefix with `prompt`, preferring a parked one
        that the prompt extends (it can be taken over without a copy)."""
        candidates, depth = self.index.longest_match(prompt)
        best, best_len, best_takeover = None, 0, False
        for seq in candidates:
            if seq.tokens[:depth] != prompt[:depth]:
                continue  # hash collision
            n = common_prefix(seq.tokens, prompt, depth)
            takeover = seq.request is None and n == len(seq.tokens)
            if (n, takeover) > (best_len, best_takeover):
                best, best_len, best_takeover = seq, n, takeover
        return best, best_len

    def _start(self, req: Request, takeover: Sequence | None, fork: tuple[Sequence | None, int] | None,
               version: int) -> None:
        self.clock += 1
        if takeover is not None:
            seq = takeover
            del self.parked[seq]
            seq.tokens = list(req.prompt)
        else:
            seq = Sequence(list(req.prompt), self._free_row(), kv_version=version)
            self.rows[seq.row] = seq
            source, shared = fork or (None, 0)
            usable = min(shared, len(req.prompt) - 1)  # the last prompt id must run to give logits
            if source is not None and usable > 0:
                seq.fork_from = (source, usable)
                self.resolve_fork(seq)
        seq.cached = min(seq.cached, len(req.prompt) - 1)
        seq.request, seq.admitted, seq.last_used = req, self.clock, self.clock
        req.seq = seq
        req.reused = seq.cached if seq.fork_from is None else seq.fork_from[1]
        self.active.append(seq)
        self.cache.reserve(len(self.rows), req.reserved)
        if self.enable_prefix_caching:
            self.index.add(seq)

    def resolve_fork(self, seq: Sequence) -> bool:
        """Copy the shared prefix into `seq`'s row once its source has computed it."""
        if seq.fork_from is None:
            return True
        source, n = seq.fork_from
        if source.row < 0 or (source.request is None and source.cached < n):
            seq.fork_from, seq.cached = None, 0  # the source went away: prefill everything
            return True
        if source.cached < n:
            return False  # the source is still being prefilled
        self.cache.copy_prefix(source.row, seq.row, n)
        seq.cached, seq.kv_version, seq.fork_from = n, source.kv_version, None
        return True

    # ------------------------------------------------------------------ rows
    def _free_row(self) -> int:
        for i, s in enumerate(self.rows):
            if s is None:
                return i
        self.rows.append(None)
        return len(self.rows) - 1

    def arrange_decode_rows(self, seqs: list[Sequence]) -> None:
        """Move `seqs` into rows 0..len-1 (by swapping rows) so a decode pass reads a view."""
        n = len(seqs)
        wanted = set(seqs)
        holes = [r for r in range(n) if self.rows[r] not in wanted]
        movers = [s for s in seqs if s.row >= n]
        for seq, hole in zip(movers, holes):
            other = self.rows[hole]
            span = max(seq.cached, other.cached if other is not None else 0)
            self.cache.swap_rows(seq.row, hole, span)
            self.rows[seq.row], self.rows[hole] = other, seq
            if other is not None:
                other.row = seq.row
            seq.row = hole

    # ------------------------------------------------------------------ finishing
    def finish(self, seq: Sequence) -> None:
        """The request of `seq` is done: park its KV for reuse (or free it)."""
        self.active.remove(seq)
        seq.request = None
        self.clock += 1
        seq.last_used = self.clock
        if self.enable_prefix_caching and seq.fork_from is None:
            self.parked[seq] = None
        else:
            self._free(seq)

    def _evict_one(self, keep: set[Sequence]) -> bool:
        for seq in self.parked:
            if seq not in keep:
                del self.parked[seq]
                self._free(seq)
                self.evictions += 1
                return True
        return False

    def _free(self, seq: Sequence) -> None:
        self.index.remove(seq)
        self.rows[seq.row] = None
        seq.row = -1

    def drop_parked(self) -> None:
        """Forget every parked sequence (their KV is stale)."""
        for seq in list(self.parked):
            self._free(seq)
        self.parked.clear()

    def fail_all(self) -> list[Request]:
        """Remove every request (after an error); returns them, and forgets every sequence."""
        reqs = [s.request for s in self.active if s.request is not None] + list(self.waiting)
        for seq in self.active:
            self._free(seq)
        self.active.clear()
        self.waiting.clear()
        self.drop_parked()
        return reqs


def check_context(prompt_len: int, sampling: SamplingParams, max_model_len: int) -> int:
    """max_new_tokens clamped to the context; a prompt that leaves no room is an error."""
    if prompt_len >= max_model_len:
        raise EngineError(f"prompt of {prompt_len} tokens leaves no room to generate: the engine's "
                          f"max_model_len is {max_model_len} (rollout.max_model_len); shorten the "
                          "episode (env.max_turns) or raise max_model_len")
    return min(sampling.max_new_tokens, max_model_len - prompt_len)
