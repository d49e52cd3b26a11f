"""Scheduling without a model: prefix matching, row take-over, twins, budgets, LRU eviction."""

import random

import torch

from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.kv_cache import SlotKVCache
from agentrl.llm.local.prefix_index import BLOCK, PrefixIndex
from agentrl.llm.local.scheduler import Request, Scheduler


def _sched(**kw):
    cache = SlotKVCache(1, 1, 2, dtype=torch.float32, device=torch.device("cpu"), max_len=512)
    kw.setdefault("max_num_seqs", 8)
    kw.setdefault("max_total_tokens", 10_000)
    return Scheduler(cache, **kw)


def _req(prompt, max_new=4):
    return Request(list(prompt), SamplingParams(max_new_tokens=max_new), max_new, random.Random(0))


def _run(sched, seq, generated):
    """Pretend the model ran: everything but the last generated id is cached, then finish."""
    seq.tokens += generated
    seq.cached = len(seq.tokens) - 1
    sched.index.add(seq)
    sched.finish(seq)


def test_next_turn_takes_over_the_parked_row():
    sched = _sched()
    p1 = list(range(10, 10 + 3 * BLOCK))
    sched.waiting.append(_req(p1))
    sched.admit(0)
    (seq,) = sched.active
    _run(sched, seq, [7, 8])
    p2 = p1 + [7, 8, 99, 98, 97]
    req = _req(p2)
    sched.waiting.append(req)
    sched.admit(0)
    assert sched.active == [seq] and req.seq is seq and not sched.parked
    assert seq.cached == len(p1) + 1 and req.reused == len(p1) + 1  # only the new ids (and id 8) remain


def test_identical_prompts_become_twins_and_shared_prefixes_are_copied():
    sched = _sched()
    prompt = list(range(40, 40 + 2 * BLOCK + 3))
    sched.waiting.extend([_req(prompt), _req(prompt), _req(prompt[:-1] + [5])])
    sched.admit(0)
    head, twin, cousin = sched.active
    assert twin.twin_of is head and twin.row != head.row
    assert cousin.fork_from == (head, len(prompt) - 1)  # waits: the head has not run yet
    head.cached = len(prompt)  # the head's prefill ran
    assert sched.resolve_fork(cousin) and cousin.cached == len(prompt) - 1
    assert sched.resolve_twin(twin, source_ready=True) and twin.cached == len(prompt)


def test_token_budget_queues_then_evicts_least_recently_used():
    sched = _sched(max_total_tokens=2 * (BLOCK + 4) + 4)
    a, b = [1] * BLOCK, [2] * BLOCK
    sched.waiting.extend([_req(a), _req(b)])
    sched.admit(0)
    assert len(sched.active) == 2
    sched.waiting.append(_req([3] * BLOCK))
    sched.admit(0)
    assert len(sched.waiting) == 1 and sched.used_tokens() == 2 * (BLOCK + 4)  # queued, not failed
    first, second = sched.active
    _run(sched, first, [5])
    _run(sched, second, [6])
    sched.admit(0)  # room is made by evicting the least recently used parked sequence
    assert not sched.waiting and sched.evictions == 1
    assert list(sched.parked) == [second] and first.row == -1
    assert sched.used_tokens() <= sched.max_total_tokens


def test_max_num_seqs_bounds_running_sequences():
    sched = _sched(max_num_seqs=2)
    sched.waiting.extend(_req([k] * 5) for k in range(4))
    sched.admit(0)
    assert len(sched.active) == 2 and len(sched.waiting) == 2


def test_a_request_that_can_never_fit_is_returned():
    sched = _sched(max_total_tokens=10)
    sched.waiting.append(_req([1] * 20))
    assert len(sched.admit(0)) == 1 and not sched.waiting


def test_decode_rows_are_arranged_in_front():
    sched = _sched()
    sched.waiting.extend(_req([k] * 3) for k in range(5))
    sched.admit(0)
    seqs = sched.active
    for s in seqs:
        s.cached = 2
    chosen = [seqs[4], seqs[1]]
    sched.arrange_decode_rows(chosen)
    assert sorted(s.row for s in chosen) == [0, 1]
    assert all(sched.rows[s.row] is s for s in seqs)


def test_prefix_index_walks_shared_blocks_and_forgets():
    class Seq:
        def __init__(self, tokens):
            self.tokens, self.block_hashes = tokens, []

    index = PrefixIndex()
    a = Seq(list(range(3 * BLOCK)))
    b = Seq(list(range(BLOCK)) + [0] * BLOCK)
    index.add(a)
    index.add(b)
    levels = index.walk(list(range(3 * BLOCK)) + [1, 2])
    assert len(levels) == 3 and b in levels[0] and levels[2] == [a]
    index.remove(a)
    assert len(index.walk(list(range(3 * BLOCK)))) == 1


def test_colliding_block_hashes_never_share_a_cache(monkeypatch):
    import agentrl.llm.local.prefix_index as prefix_index

    monkeypatch.setattr(prefix_index, "hash", lambda block: 1, raising=False)  # every block collides
    sched = _sched()
    cached = list(range(10, 10 + 2 * BLOCK))
    sched.waiting.append(_req(cached))
    sched.admit(0)
    (seq,) = sched.active
    _run(sched, seq, [7])
    other = list(range(500, 500 + 2 * BLOCK + 2))  # no id in common, same (collided) block hashes
    assert len(sched.index.walk(other)) == 2  # the index alone would call them equal
    req = _req(other)
    sched.waiting.append(req)
    sched.admit(0)
    assert req.seq is not seq and req.reused == 0 and req.seq.fork_from is None and req.seq.cached == 0
