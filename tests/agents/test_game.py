"""Games of several roles in one episode (agents/game.py): each role its own conversation and
token-exact trajectory, rewards per role, the random opponent, and the seats grouped per role."""

import asyncio

import pytest
import torch

from agentrl.agents.chat import ChatAgent
from agentrl.algos.advantages import compute_advantages
from agentrl.algos.estimator import EstimatorInput
from agentrl.algos.outcome_estimators import RoleBaselines
from agentrl.config import AlgorithmConfig
from agentrl.llm.engine import SamplingParams
from agentrl.rollout.collector import RolloutCollector
from agentrl.rollout.stats import tag_metrics
from agentrl.rollout.tasks import make_tasks
from agentrl.train.batch import pack
from agentrl.trajectory import Task
from helpers import ScriptedReplies, segments


class PileGame:
    """Two players take 1 or 2 stones in turn from a pile of 5; who takes the last stone wins.
    A reply that is not 1 or 2 is a warning the first time, a loss the second time in a row."""

    roles = ("first", "second")
    instructions = "Take 1 or 2 stones."

    def __init__(self, pile=5):
        self.start = pile

    async def reset(self, seed=None, options=None):
        self.pile, self.turn, self.strikes, self.seen = self.start, 0, 0, {r: 0 for r in self.roles}
        self.log = []
        return self._obs(), {"role": "first"}

    def _obs(self):
        role = self.roles[self.turn]
        new = self.log[self.seen[role]:]
        self.seen[role] = len(self.log)
        return "\n".join([*new, f"{role} to move; pile {self.pile}"])

    async def step(self, action):
        role = self.roles[self.turn]
        if action.strip() not in ("1", "2"):
            self.strikes += 1
            if self.strikes == 2:
                rewards = {role: -1.0, self.roles[1 - self.turn]: 1.0}
                return "forfeit", -1.0, True, False, {"rewards": rewards, "success": False}
            return "invalid; again", 0.0, False, False, {"role": role}
        self.strikes = 0
        self.pile -= min(int(action), self.pile)
        self.log.append(f"{role} took {action.strip()}")
        if self.pile == 0:
            rewards = {role: 1.0, self.roles[1 - self.turn]: -1.0}
            return "you win", 1.0, True, False, {"rewards": rewards, "success": True}
        self.turn = 1 - self.turn
        return self._obs(), 0.0, False, False, {"role": self.roles[self.turn]}

    def sample_action(self, rng):
        return rng.choice(["1", "2"])

    def close(self):
        pass


def play(agent, llm, task, env=None):
    return asyncio.run(agent.run_episode(task, env or PileGame(), llm))


def test_each_role_gets_its_own_conversation_token_exact(tiny_tokenizer):
    # first: 2 (pile 3), second: 2 (pile 1), first: 1 -> first wins
    llm = ScriptedReplies(tiny_tokenizer, ["2", "2", "1"])
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=8), max_turns=10)
    trajs = play(agent, llm, Task(env_seed=0, group_id=0, sampling_seed=1))
    first, second = trajs
    assert (first.role, second.role) == ("first", "second")
    assert (first.num_turns, second.num_turns) == (2, 1)
    assert (first.rewards, second.rewards) == ([0.0, 1.0], [-1.0])  # the loser's arrives on the winner's step
    assert first.success and not second.success and first.terminated and second.terminated
    assert first.info["metrics"] == {"win": 1.0, "draw": 0.0, "loss": 0.0}
    assert second.info["metrics"] == {"win": 0.0, "draw": 0.0, "loss": 1.0}
    # token-exact: each seat's generated spans are the engine's ids, in the order it asked
    outputs = {"first": [llm.outputs[0], llm.outputs[2]], "second": [llm.outputs[1]]}
    prompts = {"first": [llm.prompts[0], llm.prompts[2]], "second": [llm.prompts[1]]}
    for t in trajs:
        spans = segments(t.loss_mask)
        assert [t.token_ids[a:b] for a, b in spans] == outputs[t.role]
        assert [t.token_ids[:a] for a, _ in spans] == prompts[t.role]  # each prompt: that seat's sequence so far
    text = tiny_tokenizer.decode(first.token_ids)
    assert "second took 2" in text and text.count("pile 5") == 1  # the opponent's move, once; no old text again
    assert "pile 3" not in text and "pile 3" in tiny_tokenizer.decode(second.token_ids)  # the other seat's view


def test_an_invalid_move_gives_the_same_role_another_turn_and_a_second_loses(tiny_tokenizer):
    llm = ScriptedReplies(tiny_tokenizer, ["x", "y"])
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=8), max_turns=10)
    (first,) = play(agent, llm, Task(env_seed=0, group_id=0, sampling_seed=1))  # second never acted
    assert first.role == "first" and first.num_turns == 2 and first.rewards == [0.0, -1.0]
    assert "invalid; again" in tiny_tokenizer.decode(first.token_ids)


def test_the_random_opponent_plays_every_seat_but_the_policys(tiny_tokenizer):
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=8), max_turns=10)
    for group, seat in ((0, "first"), (1, "second")):
        llm = ScriptedReplies(tiny_tokenizer, ["1"] * 5)
        trajs = play(agent, llm, Task(env_seed=0, group_id=group, sampling_seed=3, opponent="random"))
        assert [t.role for t in trajs] == [seat]
        assert trajs[0].num_turns == len(llm.outputs)  # every generated reply is this seat's


def test_max_turns_counts_every_roles_steps_and_cuts_every_seat(tiny_tokenizer):
    llm = ScriptedReplies(tiny_tokenizer, ["1", "1", "1"])
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=8), max_turns=3)
    trajs = play(agent, llm, Task(env_seed=0, group_id=0, sampling_seed=1))
    assert sum(t.num_turns for t in trajs) == 3
    assert all(t.truncation_reason == "max_turns" and not t.terminated and "win" not in t.info.get("metrics", {})
               for t in trajs)


def test_seats_sample_with_seeds_of_their_own(tiny_tokenizer):
    seeds = []

    class Seeds(ScriptedReplies):
        async def generate(self, prompt_ids, sampling):
            seeds.append(sampling.seed)
            return await super().generate(prompt_ids, sampling)

    play(ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=8), max_turns=10),
         Seeds(tiny_tokenizer, ["2", "2", "1"]), Task(env_seed=0, group_id=0, sampling_seed=1))
    assert len(set(seeds)) == 3


def test_the_collector_keeps_every_seat_and_stats_and_groups_go_per_role(tiny_tokenizer):
    class Moves:
        async def generate(self, prompt_ids, sampling):
            from agentrl.llm.engine import Completion
            ids = tiny_tokenizer.encode(str(1 + sampling.seed % 2), add_special_tokens=False)
            ids.append(tiny_tokenizer.eos_token_id)
            return Completion(ids, [-0.5] * len(ids), "stop")

    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=8), max_turns=10)
    result = RolloutCollector.single(PileGame, agent, Moves()).collect(make_tasks(0, 1, 2, 4))
    trajs = result.trajectories
    assert not result.errors and len(trajs) == 16 and result.segments == 0
    metrics = tag_metrics(trajs, "env")
    for role in PileGame.roles:
        assert metrics[f"env//role/{role}/win"] + metrics[f"env//role/{role}/loss"] == pytest.approx(1.0)
    assert metrics["env//role/first/win"] == pytest.approx(1 - metrics["env//role/second/win"])
    batch = pack(trajs, 0)
    keys = {(t.group_id, t.role) for t in trajs}
    assert len(set(batch.group_index.tolist())) == len(keys) == 4  # two groups, two seats each
    for i, t in enumerate(trajs):
        for j, u in enumerate(trajs):
            same = (t.group_id, t.role) == (u.group_id, u.role)
            assert (batch.group_index[i] == batch.group_index[j]) == same


def test_rae_scores_each_return_against_its_roles_running_baseline():
    baselines = RoleBaselines(alpha=0.5)
    keys = ["ttt/first", "ttt/second", "ttt/first", "ttt/first"]
    returns = torch.tensor([1.0, -1.0, 1.0, -1.0])
    b = baselines.update(keys, returns)
    assert b.tolist() == [0.5, -0.5, 0.75, -0.125]  # b <- a*b + (1-a)*R per key, in batch order
    mask = torch.tensor([[0.0, 1.0, 1.0]] * 4)
    rewards = torch.zeros(4, 3)
    rewards[:, 2] = returns
    adv, _ = compute_advantages("rae", EstimatorInput(rewards, mask, torch.arange(4), None,
                                                      AlgorithmConfig(credit="outcome"), role_baselines=b))
    assert torch.allclose(adv[:, 1], returns - b) and torch.allclose(adv[:, 1], adv[:, 2]) and (adv[:, 0] == 0).all()
    # an episode of several sequences (a history window) moves its seat's average once, with its first
    windowed = RoleBaselines(alpha=0.5)
    assert windowed.update(["a", "a", "a", "a"], torch.tensor([1.0, 1.0, 1.0, -1.0]),
                           [True, False, False, True]).tolist() == [0.5, 0.5, 0.5, -0.25]
    restored = RoleBaselines(alpha=0.5)
    restored.load_state_dict(baselines.state_dict())
    assert restored.update(["ttt/second"], torch.tensor([1.0])).tolist() == [0.25]  # the checkpoint continues it
    with pytest.raises(ValueError, match="role_baselines"):
        compute_advantages("rae", EstimatorInput(rewards, mask, torch.arange(4), None, AlgorithmConfig()))


def test_a_history_window_plays_each_seat_as_its_kind_does(tiny_tokenizer):
    # first: 2, second: 2, first: 1 -> first wins; each turn of a seat is a sequence of its own
    llm = ScriptedReplies(tiny_tokenizer, ["2", "2", "1"])
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=8), max_turns=10, history_length=0)
    trajs = play(agent, llm, Task(env_seed=0, group_id=0, sampling_seed=1))
    assert [(t.role, t.segment) for t in trajs] == [("first", 0), ("first", 1), ("second", 0)]
    assert [t.rewards for t in trajs] == [[1.0], [1.0], [-1.0]]  # each segment: the seat's return from there
    last = tiny_tokenizer.decode(trajs[1].token_ids)
    assert "second took 2" in last and "pile 5" not in last  # the window: only the observation of its turn


def test_an_agent_that_plays_no_games_is_refused_in_one_line_before_the_run():
    pytest.importorskip("textarena")
    from agentrl.config import load_config
    from agentrl.errors import ConfigError
    from agentrl.runtime.assembly.preflight import preflight

    with pytest.raises(ConfigError, match=r"agent.type='math_retry' does not play games.*player_0, player_1") as e:
        preflight(load_config("configs/tictactoe_selfplay.yaml", ["agent.type=math_retry", "agent.args={}"]))
    assert "\n" not in str(e.value)
