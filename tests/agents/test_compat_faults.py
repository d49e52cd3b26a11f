"""Seed-style envs and agents whose rewards are not finite numbers fail the episode, naming them."""

import math
import sys

from agentrl.agents.compat import SeedAgentAdapter
from agentrl.rollout.collector import RolloutCollector
from agentrl.trajectory import Task
from test_compat import SAMPLING, EchoEnv, ScriptedReplies  # tests/agents is on sys.path (prepend mode)


class OneAnswer:
    def __init__(self, gconfig, rewards=None):
        self.gconfig, self.rewards = gconfig, rewards

    async def collect_trajectory(self, prompt, env, obs_queue, act_queue):
        await obs_queue.put((prompt.ids[0], list(prompt.data["packed_prompts"]), self.gconfig))
        await act_queue.get()
        await env.step((prompt.ids[0], ["yes"]))
        return None if self.rewards is None else {"rewards": self.rewards}


class NanEchoEnv(EchoEnv):
    async def step(self, action):
        obs, rewards, term, trunc, info = await super().step(action)
        return obs, [math.nan for _ in rewards], term, trunc, info


def _collect(tokenizer, env_cls, **agent_args):
    adapter = SeedAgentAdapter.from_class(OneAnswer, tokenizer, SAMPLING, max_turns=2, args=agent_args)
    collector = RolloutCollector.single(env_cls, adapter, ScriptedReplies(tokenizer, ["yes"] * 4))
    return collector.collect([Task(env_seed=0, group_id=0, sampling_seed=0)])


def test_a_seed_env_with_a_nan_reward_fails_the_episode_as_an_env_error(tiny_tokenizer):
    result = _collect(tiny_tokenizer, NanEchoEnv)
    assert not result.trajectories and result.failures["env"] == 1
    assert "NanEchoEnv.step() reward=[nan]; expected a finite number or a list of them" in result.errors[0]


def test_a_seed_agent_returning_string_rewards_fails_the_episode(tiny_tokenizer):
    result = _collect(tiny_tokenizer, EchoEnv, rewards=["1.0"])
    assert not result.trajectories
    assert "seed-style agent returned rewards ['1.0']; expected finite numbers" in result.errors[0]


def test_well_formed_seed_rewards_still_pass(tiny_tokenizer):
    result = _collect(tiny_tokenizer, EchoEnv, rewards=[0.5])
    assert [t.rewards for t in result.trajectories] == [[0.5]]


class ExitingAgent(OneAnswer):
    """A seed-style agent that leaves its own task (collect_trajectory runs in one) with sys.exit."""

    async def collect_trajectory(self, prompt, env, obs_queue, act_queue):
        await obs_queue.put((prompt.ids[0], list(prompt.data["packed_prompts"]), self.gconfig))
        await act_queue.get()
        sys.exit(5)


class ExitingEnv(EchoEnv):
    async def step(self, action):
        raise KeyboardInterrupt  # raised by the env (Ctrl-C reaches the main thread, not the episodes')


def test_a_seed_agent_calling_sys_exit_in_its_own_task_fails_its_episode_not_the_process(tiny_tokenizer):
    adapter = SeedAgentAdapter.from_class(ExitingAgent, tiny_tokenizer, SAMPLING, max_turns=2, args={})
    collector = RolloutCollector.single(EchoEnv, adapter, ScriptedReplies(tiny_tokenizer, ["yes"] * 4))
    result = collector.collect([Task(env_seed=0, group_id=0, sampling_seed=0)])
    assert not result.trajectories and result.failures["agent"] == 1
    assert result.errors[0].startswith("agent: SystemExit: 5 at test_compat_faults.py:")


def test_a_seed_env_raising_keyboard_interrupt_fails_its_episode_as_an_env_error(tiny_tokenizer):
    result = _collect(tiny_tokenizer, ExitingEnv)
    assert not result.trajectories and result.failures["env"] == 1
    assert result.errors[0].startswith("env: KeyboardInterrupt in step at test_compat_faults.py:")
