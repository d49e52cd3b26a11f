"""A slot KV cache: one contiguous row of keys and values per sequence, for every layer.

All layers live in one tensor shaped `(layers, 2, rows, kv_heads, capacity, head_dim)`, so
growing, copying a prefix from one row to another (a GRPO group sharing its prompt) or
swapping two rows is one tensor operation. Rows and capacity grow on demand, in steps.

The model stays a plain transformers model: for each forward pass the engine hands it a
`SlotView` as `past_key_values` and a ready 4D mask as `attention_mask={"full_attention": …}`
(transformers uses a dict of masks as is). The model calls `SlotView.update(k, v, layer)`,
which writes the new keys/values at each row's own positions and returns the keys/values the
queries attend to. Decode batches are kept in rows `0..n-1` so that this is a view, not a
copy; prefill batches gather their rows.

Why not transformers' own continuous batching (`generate_batch`, `PagedAttentionCache`): it
packs every sequence of a batch into one row with a `(tokens, tokens)` mask, which on CPU makes
attention quadratic in the batch's total length (measured: 64 prompts of 200 tokens plus 8 new
tokens took 13-15 s against 2.8 s for one left-padded `model.generate`); its scheduler runs in a
background thread (join order depends on timing) and samples without per-request seeds.
"""

from __future__ import annotations

from typing import cast

import torch
from transformers import Cache, PreTrainedConfig

SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")


def text_config(model: torch.nn.Module) -> PreTrainedConfig:
    """The config of a transformers causal LM's text decoder (a multimodal model's included)."""
    config = cast(PreTrainedConfig, model.config)  # torch types a module's attributes Tensor | Module
    return config.get_text_config()


class SlotKVCache:
    """Per-row K/V buffers for every layer of one model; rows are handed out by the scheduler."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, *, dtype: torch.dtype,
                 device: torch.device, max_len: int, row_step: int = 16, len_step: int = 256) -> None:
        self.shape = (num_layers, 2, num_kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.max_len = max_len
        self.row_step, self.len_step = row_step, len_step
        self.buf = torch.zeros(num_layers, 2, 0, num_kv_heads, 0, head_dim, dtype=dtype, device=device)
        self.peak_bytes = 0

    def clear(self) -> None:
        """Release every row: back to the empty buffers of a new cache (peak_bytes is kept)."""
        layers, two, heads, dim = self.shape
        self.buf = torch.zeros(layers, two, 0, heads, 0, dim, dtype=self.dtype, device=self.device)

    @classmethod
    def for_model(cls, model: torch.nn.Module, max_len: int) -> SlotKVCache:
        """Size the buffers from a transformers causal LM's config."""
        cfg = text_config(model)
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        param = next(model.parameters())
        return cls(cfg.num_hidden_layers, kv_heads, head_dim, dtype=param.dtype, device=param.device,
                   max_len=max_len)

    @property
    def rows(self) -> int:
        """Rows allocated."""
        return self.buf.shape[2]

    @property
    def capacity(self) -> int:
        """Tokens each row can hold."""
        return self.buf.shape[4]

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers."""
        return self.buf.numel() * self.buf.element_size()

    def bytes_per_token(self) -> int:
        """Bytes one cached token costs over all layers (keys and values)."""
        layers, two, heads, dim = self.shape
        return layers * two * heads * dim * self.buf.element_size()

    def reserve(self, rows: int, length: int) -> None:
        """Grow (never shrink) to at least `rows` rows of `length` tokens, keeping the contents."""
        if rows <= self.rows and length <= self.capacity:
            return
        # Grow geometrically: a copy of the whole cache is costly, so it must stay rare.
        new_rows, new_len = self.rows, self.capacity
        if rows > self.rows:
            new_rows = _round_up(max(rows, self.rows * 3 // 2), self.row_step)
        if length > self.capacity:
            new_len = min(_round_up(max(length, 2 * self.capacity), self.len_step), max(self.max_len, length))
        layers, two, heads, dim = self.shape
        buf = torch.zeros(layers, two, new_rows, heads, new_len, dim, dtype=self.dtype, device=self.device)
        buf[:, :, : self.rows, :, : self.capacity] = self.buf
        self.buf = buf
        self.peak_bytes = max(self.peak_bytes, self.nbytes)

    def copy_range(self, src: int, dst: int, start: int, end: int) -> None:
        """Copy cached positions `start..end-1` of row `src` into row `dst`."""
        if end > start:
            self.buf[:, :, dst, :, start:end] = self.buf[:, :, src, :, start:end]

    def swap_rows(self, a: int, b: int, n: int) -> None:
        """Exchange the first `n` positions of rows `a` and `b`."""
        if n > 0 and a != b:
            idx = torch.tensor([a, b], device=self.device)
            self.buf[:, :, idx, :, :n] = self.buf[:, :, idx.flip(0), :, :n]

    def decode_view(self, n_rows: int, positions: torch.Tensor, kv_len: int) -> SlotView:
        """View for one new token in each of rows `0..n_rows-1`, written at `positions` (n,)."""
        rows = torch.arange(n_rows, device=self.device)
        return SlotView(self, rows, positions, None, kv_len, contiguous=True)

    def prefill_view(self, rows: torch.Tensor, positions: torch.Tensor, real: torch.Tensor,
                     kv_len: int) -> SlotView:
        """View for chunks of `rows` (P,): `positions` (P, Q) where `real` (P, Q) marks non-padding."""
        return SlotView(self, rows, positions, real, kv_len, contiguous=False)


class SlotView(Cache):
    """The `past_key_values` of one forward pass: writes new K/V into their rows, returns K/V to attend."""

    def __init__(self, store: SlotKVCache, rows: torch.Tensor, positions: torch.Tensor,
                 real: torch.Tensor | None, kv_len: int, contiguous: bool) -> None:
        super().__init__(layers=[])
        self.store = store
        self.kv_len = kv_len
        self.contiguous = contiguous
        self.n_rows = rows.shape[0]
        if real is None:  # decode: one token per row
            self.write_rows, self.write_pos = rows, positions
        else:  # prefill: only real (non-padding) tokens are written
            self.write_rows = rows.unsqueeze(1).expand_as(positions)[real]
            self.write_pos = positions[real]
        self.rows, self.real = rows, real

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Store this layer's new keys/values (B, H, Q, D); return the keys/values to attend to."""
        kbuf, vbuf = self.store.buf[layer_idx, 0], self.store.buf[layer_idx, 1]
        if self.real is None:
            kbuf[self.write_rows, :, self.write_pos] = key_states[:, :, 0]
            vbuf[self.write_rows, :, self.write_pos] = value_states[:, :, 0]
        else:
            kbuf[self.write_rows, :, self.write_pos] = key_states.transpose(1, 2)[self.real]
            vbuf[self.write_rows, :, self.write_pos] = value_states.transpose(1, 2)[self.real]
        if self.contiguous:
            return kbuf[: self.n_rows, :, : self.kv_len], vbuf[: self.n_rows, :, : self.kv_len]
        return kbuf[self.rows, :, : self.kv_len], vbuf[self.rows, :, : self.kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Longest cached length among the rows of this pass (transformers asks for it)."""
        return self.kv_len

    def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:
        """(kv_length, kv_offset) for transformers' mask helpers; unused when masks are given."""
        return self.kv_len, 0


def attention_masks(positions: torch.Tensor, kv_len: int, dtype: torch.dtype, layer_types: set[str],
                    sliding_window: int | None) -> dict[str, torch.Tensor]:
    """Additive masks (B, 1, Q, kv_len) per layer type: query at position p sees keys 0..p.

    `positions` (B, Q) holds each query's position; -1 marks padding, which sees key 0 only
    (a fully masked row would give NaN). Additive float masks suit sdpa and eager attention.
    """
    keys = torch.arange(kv_len, device=positions.device)
    pos = positions.clamp(min=0).unsqueeze(-1)
    allowed = keys <= pos
    low = torch.finfo(dtype).min
    masks = {"full_attention": _additive(allowed, low, dtype)}
    if "sliding_attention" in layer_types:
        window = sliding_window or kv_len
        masks["sliding_attention"] = _additive(allowed & (keys > pos - window), low, dtype)
    return masks


def _additive(allowed: torch.Tensor, low: float, dtype: torch.dtype) -> torch.Tensor:
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, low)
    return mask.unsqueeze(1)


def _round_up(x: int, step: int) -> int:
    return -(-x // step) * step
