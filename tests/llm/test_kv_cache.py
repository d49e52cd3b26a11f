"""The slot KV cache: growth keeps contents; row copies and swaps move exactly the asked span;
a forward pass through a SlotView equals one through transformers' DynamicCache."""

import torch
from transformers import DynamicCache

from agentrl.llm.local.kv_cache import SlotKVCache, attention_masks


def _filled(rows=3, length=8):
    cache = SlotKVCache(2, 2, 4, dtype=torch.float32, device=torch.device("cpu"), max_len=64, row_step=2,
                        len_step=8)
    cache.reserve(rows, length)
    cache.buf.copy_(torch.randn(cache.buf.shape))
    return cache


def test_growth_keeps_contents_and_is_geometric():
    cache = _filled()
    before = cache.buf.clone()
    cache.reserve(5, 20)
    assert cache.rows >= 5 and cache.capacity >= 20
    assert torch.equal(cache.buf[:, :, : before.shape[2], :, : before.shape[4]], before)
    assert not cache.buf[:, :, before.shape[2]:].any()  # new rows start at zero (masked keys stay finite)
    rows, capacity = cache.rows, cache.capacity
    cache.reserve(rows, capacity)
    assert (cache.rows, cache.capacity) == (rows, capacity)
    assert cache.peak_bytes == cache.nbytes


def test_copy_range_and_swap_rows():
    cache = _filled()
    before = cache.buf.clone()
    cache.copy_range(0, 2, 2, 5)
    assert torch.equal(cache.buf[:, :, 2, :, 2:5], before[:, :, 0, :, 2:5])
    assert torch.equal(cache.buf[:, :, 2, :, 5:], before[:, :, 2, :, 5:])
    assert torch.equal(cache.buf[:, :, 2, :, :2], before[:, :, 2, :, :2])
    before = cache.buf.clone()
    cache.swap_rows(0, 1, 6)
    assert torch.equal(cache.buf[:, :, 0, :, :6], before[:, :, 1, :, :6])
    assert torch.equal(cache.buf[:, :, 1, :, :6], before[:, :, 0, :, :6])
    assert torch.equal(cache.buf[:, :, 0, :, 6:], before[:, :, 0, :, 6:])


def test_masks_let_each_query_see_its_past_only():
    pos = torch.tensor([[-1, 3, 4], [2, 3, 4]])
    mask = attention_masks(pos, 5, torch.float32, {"full_attention", "sliding_attention"}, sliding_window=2)
    full, sliding = mask["full_attention"], mask["sliding_attention"]
    assert full.shape == (2, 1, 3, 5)
    seen = full[:, 0] == 0
    assert seen[0, 0].tolist() == [True, False, False, False, False]  # padding sees key 0 only
    assert seen[1, 0].tolist() == [True, True, True, False, False]
    assert (sliding[1, 0, 2] == 0).tolist() == [False, False, False, True, True]


def test_slot_passes_equal_a_dynamic_cache(tiny_model):
    """Prefill two rows of different lengths (left-padded) then decode: logits equal transformers'."""
    ids = [[5, 9, 14, 7, 30, 31], [8, 12, 40]]
    cache = SlotKVCache.for_model(tiny_model, 32)
    cache.reserve(2, 16)
    width = 6
    pos = torch.tensor([list(range(6)), [-1, -1, -1, 0, 1, 2]])
    inp = torch.tensor([ids[0], [0, 0, 0] + ids[1]])
    with torch.no_grad():
        out = tiny_model(input_ids=inp, position_ids=pos.clamp(min=0), use_cache=True, logits_to_keep=1,
                         attention_mask=attention_masks(pos, width, torch.float32, {"full_attention"}, None),
                         past_key_values=cache.prefill_view(torch.tensor([0, 1]), pos, pos >= 0, width)).logits
        nxt = out[:, -1].argmax(-1)
        step_pos = torch.tensor([6, 3])
        dec = tiny_model(input_ids=nxt[:, None], position_ids=step_pos[:, None], use_cache=True,
                         attention_mask=attention_masks(step_pos[:, None], 7, torch.float32, {"full_attention"}, None),
                         past_key_values=cache.decode_view(2, step_pos, 7)).logits[:, -1]
        for r, row in enumerate(ids):
            ref = tiny_model(input_ids=torch.tensor([row]), past_key_values=DynamicCache(), use_cache=True)
            assert torch.allclose(out[r, -1], ref.logits[0, -1], atol=1e-5)
            ref2 = tiny_model(input_ids=nxt[r].view(1, 1), past_key_values=ref.past_key_values, use_cache=True)
            assert torch.allclose(dec[r], ref2.logits[0, -1], atol=1e-5)
