"""Work lost made visible: every generated id that reaches no loss is counted under its cause
(rollout/discarded_tokens/<cause>), and the versions of the trained ids are accounted for
(rollout/version_coverage, staleness, replies spanning versions), a missing version never
counting as age 0."""

import asyncio

from agentrl.agents.chat import ChatAgent
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.rollout.collector import CollectResult, RolloutCollector
from agentrl.rollout.demos import ScriptedClient
from agentrl.rollout.filters import informative_groups, top_variance_groups
from agentrl.rollout.source import fill_step
from agentrl.rollout import stats
from agentrl.rollout.stream import ReadyGroup, RolloutStream, min_version
from agentrl.rollout.tasks import make_tasks
from agentrl.trajectory import Trajectory

from test_collector import ScheduledFaults  # tests/rollout is on sys.path (pytest prepend mode)


def _t(group, reward, generated=1, versions=None):
    """A trajectory of one prompt id and `generated` reply ids (of `versions`, all 0 by default)."""
    versions = [0] * generated if versions is None else versions
    return Trajectory([1] * (generated + 1), [0] + [1] * generated, [0.0] * (generated + 1), [-1, *versions],
                      [reward], [generated], group, group, success=reward > 0)


def _batch(groups):
    return lambda attempt: (groups, CollectResult([t for g in groups for t in g]), 0)


def test_a_group_the_filter_drops_counts_its_ids_as_filtered():
    # DAPO drops group 1 (both episodes scored 1): its 3 + 4 ids reach no loss
    groups = [[_t(0, 0.0, 2), _t(0, 1.0, 5)], [_t(1, 1.0, 3), _t(1, 1.0, 4)]]
    step = fill_step(_batch(groups), need=2, keep=lambda gs: informative_groups(gs, "reward"), max_batches=1)
    m = step.result.metrics()
    assert m["rollout/discarded_tokens/filtered"] == 7.0 and m["rollout/discarded_tokens"] == 7.0
    # without a filter nothing is lost
    groups = [[_t(0, 0.0, 2), _t(0, 1.0, 5)], [_t(1, 1.0, 3), _t(1, 1.0, 4)]]
    m = fill_step(_batch(groups), need=2, keep=None, max_batches=1).result.metrics()
    assert m["rollout/discarded_tokens"] == 0.0 and m["rollout/discarded_tokens/filtered"] == 0.0


def test_groups_the_trainer_drops_after_the_source_count_as_filtered():
    # RAGEN's variance filter runs in the trainer, on what the source handed over
    groups = [[_t(0, 0.0, 2), _t(0, 0.0, 5)], [_t(1, 0.0, 3), _t(1, 1.0, 4)]]
    step = fill_step(_batch(groups), need=2, keep=None, max_batches=1)
    kept = top_variance_groups(step.groups, 0.5)
    step.result.trajectories = [t for g in kept for t in g]
    assert step.result.metrics()["rollout/discarded_tokens/filtered"] == 7.0


def test_a_failed_episode_counts_every_id_its_group_decoded_as_failed(tiny_tokenizer):
    # Episode 0 fails both attempts at its first env step (after one reply each): its group is
    # dropped whole, episode 1's trajectory with it. Every id decoded is trained or counted.
    ScheduledFaults.created = 0
    client = ScriptedClient(tiny_tokenizer, lambda: ScheduledFaults({(0, 1): "raise", (1, 1): "raise"}))
    decoded = []
    generate = client.generate

    async def counted(prompt_ids, sampling):
        out = await generate(prompt_ids, sampling)
        decoded.append(len(out.token_ids))
        return out

    client.generate = counted
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=8), max_turns=3)
    collector = RolloutCollector.single(client.env_factory, agent, client, max_retries=1)
    result = collector.collect(make_tasks(0, 1, 2, 2))
    assert result.dropped_groups == 1 and {t.group_id for t in result.trajectories} == {1}
    m = result.metrics()
    trained = sum(t.num_generated for t in result.trajectories)
    assert m["rollout/discarded_tokens/failed"] > 0
    assert m["rollout/discarded_tokens/failed"] + trained == sum(decoded)
    assert m["rollout/discarded_tokens"] == m["rollout/discarded_tokens/failed"]


class _Watchless:
    timeout = None  # the stream's watch reads the collector's episode timeout


def test_a_group_the_stream_drops_as_too_stale_counts_its_ids_as_stale():
    stream = RolloutStream(_Watchless(), None, lambda n: [], groups_per_step=1, max_staleness=1)
    old = [_t(0, 1.0, 3, [0, 0, 1]), _t(0, 0.0, 2, [1, 1])]  # oldest id of version 0
    fresh = [_t(1, 1.0, 4, [1, 2, 2, 2])]
    stream._ready = [ReadyGroup(0, old, CollectResult(old), min_version(old)),
                     ReadyGroup(1, fresh, CollectResult(fresh), min_version(fresh))]
    taken, stale = stream.take(1, version=2)  # trains version 2: ids of version 0 are 2 behind
    assert stale == 1 and [g.index for g in taken] == [1]
    assert stream.pop_stale_ids() == 5 and stream.pop_stale_ids() == 0
    stream._loop.close()


def test_a_missing_version_is_never_counted_as_age_0():
    # 2 of 4 reply ids have no known version (-1): they are left out of the staleness, which
    # is that of the known ids only, and counted against the coverage
    t = _t(0, 1.0, 4, [1, -1, -1, 1])
    m = stats.provenance_metrics([t], version=3)
    assert m["rollout/version_coverage"] == 0.5
    assert m["rollout/staleness_mean"] == 2.0 and m["rollout/staleness_max"] == 2.0
    # a reply of version 2 and a missing one does not span versions
    t = _t(0, 1.0, 2, [2, -1])
    assert stats.partial_replies(t) == 0 and stats.provenance_metrics([t], 3)["rollout/replies_spanning_versions"] == 0.0
    # a group whose ids have no known version is not judged stale (nor current)
    assert min_version([_t(0, 1.0, 2, [-1, -1])]) is None


def test_provenance_of_replies_that_span_versions():
    trajs = [_t(0, 1.0, 4, [0, 0, 1, 1]), _t(0, 0.0, 2, [1, 1])]
    m = stats.provenance_metrics(trajs, version=1)
    assert m["rollout/version_coverage"] == 1.0
    assert m["rollout/replies_spanning_versions"] == 0.5
    assert m["rollout/staleness_mean"] == 2 / 6 and m["rollout/staleness_max"] == 1.0


def test_the_engine_counts_ids_of_a_request_whose_caller_stopped_waiting(tiny_model, tiny_tokenizer):
    engine = LocalEngine(tiny_model, eos_token_ids=(), pad_token_id=tiny_tokenizer.pad_token_id, seed=0)
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        engine.submit([1, 2, 3], SamplingParams(max_new_tokens=32, seed=1), future)
        for _ in range(4):
            engine.serve_step()
        decoded = len(engine.sched.active[0].request.out)
        assert decoded > 0
        future.cancel()  # the episode was cancelled (its timeout) mid-reply
        engine.serve_step()
        assert not engine.has_work()
        engine.pop_metrics()  # the perf/ counters restart; this one is the rollout source's to read
        assert engine.pop_discarded_tokens() == decoded and engine.pop_discarded_tokens() == 0
    finally:
        loop.close()
