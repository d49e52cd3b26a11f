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
from agentrl.llm.engine import FinishReason, SamplingParams
from agentrl.llm.local.kv_cache import SlotKVCache
from agentrl.llm.local.prefix_index import BLOCK, PrefixIndex, common_prefix


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
    finish: FinishReason | None = None
    stop_reason: int | str | None = None
    aborted: bool = False
    reused: int = 0  # prompt ids served from the cache
    seq: Sequence | None = None

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
    fork_from: tuple[Sequence, int] | None = None  # copy this many positions of that sequence first
    twin_of: Sequence | None = None  # same prompt as that running sequence: share its KV and first logits
    kv_version: int = 0  # oldest weights version among the cached KV
    last_used: int = 0
    admitted: int = 0  # admission order, for fair chunked prefill
    block_hashes: list[int] = field(default_factory=list)

    @property
    def uncached(self) -> int:
        """Ids still to run through the model."""
        return len(self.tokens) - self.cached

    @property
    def active_request(self) -> Request:
        """The request a running sequence serves (a parked one has none)."""
        if self.request is None:
            raise EngineError("a parked sequence has no request")
        return self.request

    @property
    def waiting_on_source(self) -> bool:
        """Whether the sequence waits for another one to compute its shared prefix."""
        return self.fork_from is not None or self.twin_of is not None


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
        self.index: PrefixIndex[Sequence] = PrefixIndex()
        self.clock = 0  # admissions and finishes so far, for LRU order
        self.evictions = 0
        self._reserved = 0  # prompt + max new tokens of every running request
        self._parked_tokens = 0  # ids held by parked sequences

    # ------------------------------------------------------------------ accounting
    def used_tokens(self) -> int:
        """Tokens counted against `max_total_tokens` now: running requests at their reserved
        length, parked sequences at their length."""
        return self._reserved + self._parked_tokens

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
            owner, source, shared = self._match(req.prompt) if self.enable_prefix_caching else (None, None, 0)
            extra = req.reserved - (len(owner.tokens) if owner is not None else 0)
            keep = {s for s in (owner, source) if s is not None}
            while self.used_tokens() + extra > self.max_total_tokens and self._evict_one(keep):
                pass
            if self.used_tokens() + extra > self.max_total_tokens:
                break  # wait for running sequences to finish
            self.waiting.popleft()
            self._start(req, owner, source, shared, version)
        return rejected

    def _match(self, prompt: list[int]) -> tuple[Sequence | None, Sequence | None, int]:
        """(owner, source, shared) for a new prompt.

        owner: the longest parked sequence that `prompt` extends; the request takes its row over
        (no copy). source: the cached sequence sharing the longest prefix with `prompt`, which
        may hold more than the owner (group siblings with the same history so far).
        """
        levels = self.index.walk(prompt)
        if not levels:
            return None, None, 0
        depth = len(levels) * BLOCK
        source, shared = None, 0
        for seq in levels[-1]:
            n = common_prefix(seq.tokens, prompt, depth)
            # The ids below `depth` agree unless their block hashes collided: compared (a copy
            # of the whole prefix) only for a candidate that would win.
            if n > shared and seq.tokens[:depth] == prompt[:depth]:
                source, shared = seq, n
        owner = None
        for level in range(len(levels) - 1, -1, -1):  # a parked sequence is listed at its last full block
            for seq in levels[level]:
                n = len(seq.tokens)
                if (seq.request is None and len(seq.block_hashes) == level + 1 and n <= len(prompt)
                        and (owner is None or n > len(owner.tokens)) and prompt[:n] == seq.tokens):
                    owner = seq
            if owner is not None:
                break
        return owner, source, shared

    def _start(self, req: Request, owner: Sequence | None, source: Sequence | None, shared: int,
               version: int) -> None:
        self.clock += 1
        if owner is not None:
            seq = owner
            del self.parked[seq]
            self._parked_tokens -= len(seq.tokens)
            seq.tokens = list(req.prompt)
            seq.cached = min(seq.cached, len(req.prompt) - 1)
        else:
            seq = Sequence(list(req.prompt), self._free_row(), kv_version=version)
            self.rows[seq.row] = seq
        self._reserved += req.reserved
        self.cache.reserve(len(self.rows), req.reserved)
        if source is not None and source is not seq:
            root = source.twin_of or source
            if (shared == len(req.prompt) and root.request is not None and len(root.tokens) == len(req.prompt)
                    and root.uncached > 0):
                seq.twin_of = root  # root's next logits are this prompt's: no pass of its own
            elif min(shared, len(req.prompt) - 1) > seq.cached:  # the last id must run to give logits
                seq.fork_from = (source, min(shared, len(req.prompt) - 1))
                self.resolve_fork(seq)
        seq.request, seq.admitted, seq.last_used = req, self.clock, self.clock
        req.seq = seq
        req.reused = len(req.prompt) if seq.twin_of else seq.fork_from[1] if seq.fork_from else seq.cached
        self.active.append(seq)
        if self.enable_prefix_caching:
            self.index.add(seq)

    def resolve_fork(self, seq: Sequence) -> bool:
        """Copy the shared prefix into `seq`'s row once its source has computed it."""
        if seq.fork_from is None:
            return True
        source, n = seq.fork_from
        if source.row < 0 or (source.request is None and source.cached < n):
            seq.fork_from = None  # the source went away: prefill from what the row holds
            return True
        if source.cached < n:
            return False  # the source is still being prefilled
        self._copy(source, seq, n)
        seq.fork_from = None
        return True

    def resolve_twin(self, seq: Sequence, source_ready: bool) -> bool:
        """Copy the whole prompt's KV from the twin's source once the source has run it (its
        logits are then the twin's too); a source that went away leaves the twin to prefill."""
        source = seq.twin_of
        if source is None:
            raise EngineError("resolve_twin takes a twin: a sequence that shares another one's prompt")
        if source_ready:
            self._copy(source, seq, len(seq.tokens))
            seq.twin_of = None
            return True
        if source.request is None or source.row < 0:
            seq.twin_of = None
            seq.active_request.reused = seq.cached
        return False

    def _copy(self, source: Sequence, seq: Sequence, n: int) -> None:
        self.cache.copy_range(source.row, seq.row, seq.cached, n)
        seq.cached = n
        seq.kv_version = min(seq.kv_version, source.kv_version)

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
        if all(s.row < n for s in seqs):
            return  # the usual case: nobody joined or left since the last pass
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
        self._reserved -= seq.active_request.reserved
        seq.request = None
        self.clock += 1
        seq.last_used = self.clock
        if self.enable_prefix_caching and not seq.waiting_on_source:
            self.parked[seq] = None
            self._parked_tokens += len(seq.tokens)
        else:
            self._free(seq)

    def _evict_one(self, keep: set[Sequence]) -> bool:
        for seq in self.parked:
            if seq not in keep:
                del self.parked[seq]
                self._parked_tokens -= len(seq.tokens)
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
        self._parked_tokens = 0

    def reset(self) -> bool:
        """Forget every parked sequence and return rows and cache to the state of a new
        scheduler; refused (False) while a request waits or runs."""
        if self.has_work():
            return False
        self.drop_parked()
        self.rows.clear()
        self.index = PrefixIndex()
        self.clock = 0
        self.cache.clear()
        return True

    def fail_all(self) -> list[Request]:
        """Remove every request (after an error); returns them, and forgets every sequence."""
        reqs = [s.request for s in self.active if s.request is not None] + list(self.waiting)
        for seq in self.active:
            self._free(seq)
        self.active.clear()
        self.waiting.clear()
        self._reserved = 0
        self.drop_parked()
        return reqs


def check_context(prompt_len: int, sampling: SamplingParams, max_model_len: int) -> int:
    """max_new_tokens clamped to the context; a prompt that leaves no room is an error."""
    if prompt_len >= max_model_len:
        raise EngineError(f"prompt of {prompt_len} tokens leaves no room to generate: the engine's "
                          f"max_model_len is {max_model_len} (rollout.max_model_len); shorten the "
                          "episode (env.max_turns) or raise max_model_len")
    return min(sampling.max_new_tokens, max_model_len - prompt_len)
