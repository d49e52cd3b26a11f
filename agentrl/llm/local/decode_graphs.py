"""The engine's decode pass at fixed shapes, replayed as CUDA graphs (vLLM's cudagraph capture).

With a few-token reply per turn and a batch of tens of episodes, a decode pass of a real model
on a GPU is bound by kernel launches, not arithmetic; a CUDA graph launches the whole pass at
once (measured on an H200, the 0.5B shape playing 64 FrozenLake episodes: 918 generated tokens/s
eager, 3,504 with graphs; HF `generate` 913-927). A graph has fixed shapes and addresses, so the
pass is run at a padded batch size (a bucket: 1, 2, 4, 8, then multiples of 8) over the cache's
full capacity, with the additive mask computed inside the graph from the positions; the padding
rows write into a scratch row of the cache that no sequence owns, and their logits are dropped.
Anything that moves the cache (it grew, or was cleared) or changes the model's modules (the
first LoRA push) makes the engine capture again.

Without CUDA (`capture=False`) the same fixed-shape pass runs eagerly: that is how the padding,
the scratch row and the full-capacity mask are tested on CPU.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from agentrl.errors import EngineError
from agentrl.llm.local.kv_cache import SlotKVCache, SlotView, attention_masks


class DecodeEngine(Protocol):
    """What a decode pass reads from the engine that owns it (`LocalEngine` is one)."""

    model: Any  # a Hugging Face causal LM; the first LoRA push replaces it
    cache: SlotKVCache
    layer_types: set[str]
    sliding_window: int | None
    pad_token_id: int


def decode_logits(engine: DecodeEngine, ids: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor,
                  kv_len: int) -> torch.Tensor:
    """Next-token logits of one decode pass: `ids` (B, 1) at `pos` (B,) written into cache `rows`
    (B,), the queries reading rows 0..B-1 up to `kv_len` keys (eager, or inside a graph)."""
    view = SlotView(engine.cache, rows, pos, None, kv_len, contiguous=True)
    masks = attention_masks(pos.unsqueeze(1), kv_len, engine.cache.dtype, engine.layer_types, engine.sliding_window)
    return engine.model(input_ids=ids, position_ids=pos.unsqueeze(1), attention_mask=masks,
                        past_key_values=view, use_cache=True).logits[:, -1]


def bucket(n: int) -> int:
    """The padded batch size a decode pass of `n` rows runs at."""
    if n <= 8:
        return 1 << (n - 1).bit_length()
    return -(-n // 8) * 8


class DecodeGraphs:
    """Decode passes of one engine's model at bucketed batch sizes, captured once per cache layout."""

    def __init__(self, engine: DecodeEngine, capture: bool) -> None:
        self.engine = engine  # its model (replaced by the first LoRA push) and its cache's layout
        self.cache: SlotKVCache = engine.cache
        self.capture = capture
        self.captures = 0  # graphs captured so far (a test reads it)
        self._layout: tuple | None = None
        self._runs: dict[int, tuple] = {}
        self._pool: Any = None  # torch's opaque graph pool handle, once a graph is captured

    def invalidate(self) -> None:
        """Forget every captured pass (the model's modules changed)."""
        self._layout = None

    def decode(self, ids: list[int], positions: list[int], rows_in_use: int) -> torch.Tensor:
        """Next-token logits (n, V) of the sequences in cache rows 0..n-1, whose last ids are `ids`
        at `positions`; `rows_in_use` rows of the cache belong to sequences (the scratch row is
        beyond them)."""
        n = len(ids)
        size = bucket(n)
        self.cache.reserve(max(rows_in_use + 1, size + 1), self.cache.capacity)
        layout = (self.cache.buf.data_ptr(), tuple(self.cache.buf.shape), id(self.engine.model))
        if layout != self._layout:
            self._runs.clear()
            self._pool = None  # graphs captured into a pool that freed graphs used trip the allocator
            self._layout = layout
        if size not in self._runs:
            try:
                self._runs[size] = self._build(size)
            except RuntimeError as e:
                # No fallback: a failed capture leaves the process's CUDA random generator unusable
                # (measured: the next torch.randint raised), so the run must not go on as if nothing happened.
                raise EngineError(f"CUDA graph capture of the decode pass failed ({str(e)[:200]}); set "
                                  "engine.enforce_eager=true to decode without graphs") from e
        graph, static_ids, static_pos, static_rows, logits = self._runs[size]
        pad = size - n
        static_ids.copy_(torch.tensor(ids + [self.engine.pad_token_id] * pad).view(size, 1), non_blocking=True)
        static_pos.copy_(torch.tensor(positions + [0] * pad), non_blocking=True)
        scratch = self.cache.rows - 1
        static_rows.copy_(torch.tensor(list(range(n)) + [scratch] * pad), non_blocking=True)
        if graph is None:
            self._forward(static_ids, static_pos, static_rows, logits)
        else:
            graph.replay()
        return logits[:n]

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(decode_logits(self.engine, ids, pos, rows, self.cache.capacity))

    def _build(self, size: int) -> tuple:
        dev = self.cache.device
        ids = torch.full((size, 1), self.engine.pad_token_id, dtype=torch.long, device=dev)
        pos = torch.zeros(size, dtype=torch.long, device=dev)
        rows = torch.full((size,), self.cache.rows - 1, dtype=torch.long, device=dev)  # all scratch
        vocab = self.engine.model.config.get_text_config().vocab_size
        out = torch.zeros(size, vocab, dtype=self.cache.dtype, device=dev)
        if not self.capture:
            return None, ids, pos, rows, out
        # Warm up on a side stream (allocator, lazy inits), then capture; every pass writes only
        # into the scratch row, so no sequence's keys/values change here.
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(ids, pos, rows, out)
        torch.cuda.current_stream(dev).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: with rollout.max_staleness >= 1 the trainer runs CUDA work on another
        # thread while this one captures; "global" would fail that thread's calls.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._forward(ids, pos, rows, out)
        self.captures += 1
        return graph, ids, pos, rows, out
