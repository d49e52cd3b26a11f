"""The background rollout stream: admission within the staleness bound, stale groups dropped,
weights applied between engine steps, the task-source position kept for resume."""

import contextlib
import time

import pytest

from agentrl.agents.chat import ChatAgent
from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.rollout.collector import RolloutCollector
from agentrl.rollout.stream import RolloutStream
from agentrl.rollout.tasks import make_tasks

G, GROUP_SIZE = 2, 2


def _group_tasks(index):
    step, g = divmod(index, G)
    tasks = make_tasks(0, step + 1, G, GROUP_SIZE)[g * GROUP_SIZE:(g + 1) * GROUP_SIZE]
    for t in tasks:
        t.group_id = index
    return tasks


@contextlib.contextmanager
def _running(model, tok, k, **kw):
    """A started stream over a fresh engine, closed on the way out."""
    engine = LocalEngine(model, eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id, seed=0)
    agent = ChatAgent(tok, SamplingParams(max_new_tokens=4), max_turns=2)
    collector = RolloutCollector.single(lambda: FrozenLakeEnv(max_steps=2), agent, engine)
    stream = RolloutStream(collector, engine, _group_tasks, G, k, **kw)
    stream.start()
    try:
        yield stream
    finally:
        stream.close()


def _wait_ready(stream, n):
    deadline = time.monotonic() + 120
    while stream.counts()["ready"] < n:
        assert time.monotonic() < deadline, f"stream never had {n} ready groups: {stream.counts()}"
        time.sleep(0.01)


@pytest.mark.parametrize("k", [1, 2])
def test_no_more_groups_start_than_the_bound_allows(tiny_model, tiny_tokenizer, k):
    with _running(tiny_model, tiny_tokenizer, k) as stream:
        _wait_ready(stream, (k + 1) * G)  # versions 0..k may all be played by policy 0
        assert stream.counts() == {"started": (k + 1) * G, "ready": (k + 1) * G}
        groups, stale = stream.take(G, version=0)
        assert stale == 0 and len(groups) == G and all(g.min_version == 0 for g in groups)
        assert stream.counts()["started"] == (k + 1) * G  # taking alone frees no place: an update does
        assert stream.load_weights(tiny_model.state_dict()) == 1
        _wait_ready(stream, k * G + G)
        assert stream.counts()["started"] == (k + 2) * G


def test_groups_beyond_the_bound_are_dropped_and_replaced(tiny_model, tiny_tokenizer):
    with _running(tiny_model, tiny_tokenizer, 1) as stream:
        _wait_ready(stream, 2 * G)  # all played by policy 0
        weights = tiny_model.state_dict()
        stream.load_weights(weights)
        assert stream.load_weights(weights) == 2
        groups, stale = stream.take(G, version=2)  # policy 0 is now 2 versions behind
        assert stale == 2 * G
        assert len(groups) == G and all(g.min_version >= 1 for g in groups)
        assert all(v >= 1 for g in groups for t in g.trajectories for v, m in zip(t.versions, t.loss_mask) if m)


def test_drop_mode_takes_only_groups_of_the_current_policy(tiny_model, tiny_tokenizer):
    with _running(tiny_model, tiny_tokenizer, 1, accept_stale=False) as stream:
        _wait_ready(stream, 2 * G)
        stream.take(G, version=0)
        stream.load_weights(tiny_model.state_dict())
        groups, stale = stream.take(G, version=1)
        assert stale == G and all(g.min_version == 1 for g in groups)


def test_consumed_groups_are_skipped_by_a_resumed_stream(tiny_model, tiny_tokenizer):
    with _running(tiny_model, tiny_tokenizer, 1) as stream:
        groups, _ = stream.take(3, version=0)
        state = stream.state()
    taken = {g.index for g in groups}
    assert len(taken) == 3
    assert set(range(state["watermark"])) | set(state["above"]) == taken
    with _running(tiny_model, tiny_tokenizer, 1, consumed=state) as resumed:
        again, _ = resumed.take(2 * G - 3, version=0)
    assert not taken & {g.index for g in again}
    assert {g.index for g in again} <= set(range(2 * G))  # the places left within the bound
