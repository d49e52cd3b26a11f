"""The engine replica's serving protocol (runtime/ray/engine_actor.py + runtime/ray/engine_client.py),
driven in this process: Ray's `handle.method.remote(...)` becomes a direct call on the actor
object, so the protocol itself is what is tested, without a cluster."""

import asyncio
import types

import pytest
import torch

from agentrl.agents.chat import ChatAgent
from agentrl.config import load_config
from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.models.loading import load_pretrained, save_pretrained
from agentrl.rollout.collector import RolloutCollector
from agentrl.rollout.tasks import TaskSource
from agentrl.runtime.assembly.plan import plan
from agentrl.runtime.ray.engine_actor import EngineActor
from agentrl.runtime.ray.engine_client import RayEngineClient
from agentrl.runtime.ray.weight_sync import FileTransport
from agentrl.runtime.ray.workers import ModelSource, RunSpec

TASKS = TaskSource(seed=3, group_size=3, train_tags=("",) * 4)


class InProcess:
    """An actor handle whose `.method.remote(*args)` calls the object directly."""

    def __init__(self, obj):
        self.obj = obj

    def __getattr__(self, name):
        return types.SimpleNamespace(remote=getattr(self.obj, name))


@pytest.fixture(autouse=True)
def one_thread():
    """The actor sets torch's threads to runtime.num_threads (1 here); CPU kernels add up in another
    order with another thread count, so the in-process engine runs with 1 too, and the count is restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model_dir(tiny_model, tiny_tokenizer, tmp_path_factory):
    return save_pretrained(tiny_model, tiny_tokenizer, tmp_path_factory.mktemp("m") / "model")


def _actor(model_dir, tokenizer):
    cfg = load_config(None, [f"model.path={model_dir}"])
    return EngineActor(RunSpec(plan(cfg), cfg, tokenizer, ModelSource(path=str(model_dir)), 2048, {}), index=0, seed=0)


def _collector(tokenizer, llm):
    agent = ChatAgent(tokenizer, SamplingParams(max_new_tokens=5), max_turns=3)
    return RolloutCollector.single(lambda: FrozenLakeEnv(max_steps=3), agent, llm)


def _record(result):
    return [(t.env_seed, t.token_ids, t.logprobs, t.versions) for t in result.trajectories]


def test_one_client_gets_exactly_what_the_in_process_engine_gives(model_dir, tiny_tokenizer):
    """The protocol admits what the local engine admits after each step: same ids, same logprobs."""
    engine = LocalEngine(load_pretrained(model_dir)[0], eos_token_ids=(tiny_tokenizer.eos_token_id,),
                         pad_token_id=tiny_tokenizer.pad_token_id, tokenizer=tiny_tokenizer, seed=0)
    local = _collector(tiny_tokenizer, engine).collect(TASKS.step(1))
    actor = _actor(model_dir, tiny_tokenizer)
    client = RayEngineClient([InProcess(actor)], ["engine-0"], client="env_manager-0")
    remote = _collector(tiny_tokenizer, client).collect(TASKS.step(1))
    assert len(local.trajectories) == 12 and max(t.num_turns for t in local.trajectories) > 1
    assert _record(remote) == _record(local)
    assert actor.engine.stats.steps == engine.stats.steps  # the same engine steps, batch for batch


def test_two_clients_share_a_replica_and_every_episode_finishes(model_dir, tiny_tokenizer):
    actor = _actor(model_dir, tiny_tokenizer)
    collectors = [_collector(tiny_tokenizer, RayEngineClient([InProcess(actor)], ["engine-0"], client=f"m{i}"))
                  for i in range(2)]

    async def both():
        return await asyncio.gather(collectors[0].acollect(TASKS.step(1)), collectors[1].acollect(TASKS.step(2)))

    results = asyncio.run(both())
    assert [len(r.trajectories) for r in results] == [12, 12] and not any(r.errors for r in results)
    assert not actor.engine.has_work() and all(not reqs for _, reqs in actor.clients.values())


def test_a_bad_request_fails_alone_and_weights_carry_their_version(model_dir, tiny_tokenizer, tmp_path):
    actor = _actor(model_dir, tiny_tokenizer)
    client = RayEngineClient([InProcess(actor)], ["engine-0"], client="c")

    async def run():
        good = client.generate([1, 2, 3], SamplingParams(max_new_tokens=3, seed=1))
        bad = client.generate([10**9], SamplingParams(max_new_tokens=3))
        return await asyncio.gather(good, bad, return_exceptions=True)

    good, bad = asyncio.run(run())
    assert len(good.token_ids) >= 1 and "outside the model's vocabulary" in str(bad)
    transport = FileTransport(tmp_path)
    payload = transport.send(actor.engine.model.state_dict(), version=7)
    assert asyncio.run(actor.load_weights(payload)) == 7 == actor.engine.policy_version


def test_a_restarted_replica_serves_nothing_until_it_has_the_current_weights(model_dir, tiny_tokenizer):
    actor = _actor(model_dir, tiny_tokenizer)
    actor.restarted = True  # what Ray's restart of the actor sets
    client = RayEngineClient([InProcess(actor)], ["engine-0"], client="c")

    async def run():
        request = asyncio.ensure_future(client.generate([1, 2, 3], SamplingParams(max_new_tokens=2, seed=1)))
        await asyncio.sleep(0.05)
        waiting = not request.done() and await actor.needs_weights()
        await actor.accept_initial()
        return waiting, await request

    waiting, completion = asyncio.run(run())
    assert waiting and completion.token_ids
