"""Collapse signals and alarms (agentrl/health.py) on hand-made episodes: each signal measures what
its name says, and the monitor raises an alarm only after warm-up and patience."""

import math

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.health import (HealthConfig, Monitor, cross_inputs, group_signals, input_dependence, reply_repeat,
                            turns)
from agentrl.trajectory import Trajectory


def episode(group, replies, states, rewards=None, success=False):
    """A multi-turn episode: per turn, 2 observation ids (the state) then the reply's ids."""
    ids, mask, positions = [], [], []
    for state, reply in zip(states, replies):
        ids += [100 + state, 101 + state]
        mask += [0, 0]
        ids += list(reply)
        mask += [1] * len(reply)
        positions.append(len(ids) - 1)
    rewards = rewards if rewards is not None else [0.0] * len(replies)
    return Trajectory(ids, mask, [0.0] * len(ids), [0] * len(ids), rewards, positions, group, 0,
                      turn_states=[f"state {s}" for s in states], success=success)


def test_dead_groups_count_equal_rewards_unless_solved():
    trajs = [episode(0, [[1]], [0], [1.0], success=True), episode(0, [[1]], [0], [1.0], success=True),  # solved
             episode(1, [[1]], [0], [0.0]), episode(1, [[2]], [0], [0.0]),  # dead: one reward, no success
             episode(2, [[1]], [0], [1.0], success=True), episode(2, [[2]], [0], [0.0])]  # learning signal
    s = group_signals(trajs)
    assert s["health/zero_std_groups"] == pytest.approx(2 / 3)
    assert s["health/dead_groups"] == pytest.approx(1 / 3)
    assert s["health/reward_std_in_group"] == pytest.approx(0.5 / 3)


def test_turns_split_replies_at_their_reward_positions():
    t = episode(0, [[7, 8], [9]], [3, 4])
    assert [(key[1], reply) for key, reply, _ in turns(t)] == [("state 3", (7, 8)), ("state 4", (9,))]
    assert [start for _, _, start in turns(t)] == [2, 6]


def test_reply_repeat_is_one_when_every_input_gets_the_same_reply():
    echo = [episode(g, [[5, 6]] * 3, [g, g + 10, g + 20]) for g in range(4)]
    assert reply_repeat(echo)["health/reply_repeat"] == 1.0
    # each input its own reply: no two different inputs share one
    varied = [episode(g, [[g, 1], [g, 2], [g, 3]], [g, g + 10, g + 20]) for g in range(4)]
    assert reply_repeat(varied)["health/reply_repeat"] == 0.0
    # one input only: repetition says nothing, the signal is left out
    assert reply_repeat([episode(0, [[1]], [0]), episode(0, [[1]], [0])]) == {}


def test_reply_repeat_counts_only_pairs_of_different_inputs():
    # the same input answered the same way twice is consistency, not an echo: 2 inputs, replies a, a | b
    trajs = [episode(0, [[1]], [0]), episode(0, [[1]], [0]), episode(1, [[2]], [1])]
    assert reply_repeat(trajs)["health/reply_repeat"] == 0.0
    trajs.append(episode(1, [[1]], [1]))  # input 1 now also answered with reply a
    # different-input pairs: (0,0)x(1,*) = 2*2 = 4; sharing reply a: 2*1 = 2
    assert reply_repeat(trajs)["health/reply_repeat"] == pytest.approx(0.5)


def test_cross_inputs_takes_the_first_turn_of_each_distinct_input():
    trajs = [episode(0, [[1], [2]], [0, 1]), episode(0, [[3], [4]], [0, 2])]
    pairs = cross_inputs(trajs, 8)
    assert [reply for _, reply in pairs] == [[1], [2], [4]]
    assert pairs[1][0] == trajs[0].token_ids[:5]  # the context: every id before the reply
    assert len(cross_inputs(trajs, 2)) == 2


def test_input_dependence_is_one_for_a_perfect_match_and_zero_without_dependence():
    n = 4
    matched = [[0.0 if i == j else -50.0 for j in range(n)] for i in range(n)]
    out = input_dependence(matched)
    assert out["health/input_dependence"] == pytest.approx(1.0, abs=1e-6)
    assert out["health/input_retrieval"] == 1.0
    blind = [[-2.0] * n for _ in range(n)]  # every reply equally likely under every input
    assert input_dependence(blind)["health/input_dependence"] == pytest.approx(0.0)
    half = [[math.log(0.5) if j in (i, (i + 1) % n) else -50.0 for j in range(n)] for i in range(n)]
    assert input_dependence(half)["health/input_dependence"] == pytest.approx(math.log(2) / math.log(4), abs=1e-6)


def test_monitor_waits_for_warmup_and_patience():
    m = Monitor(HealthConfig(warmup_steps=2, patience=2))
    bad = {"health/reply_repeat": 1.0}
    assert m.observe(1, bad)[1] == [] and m.observe(2, bad)[1] == []  # warm-up: never
    assert m.observe(3, bad)[1] == []  # first bad step after warm-up
    assert m.onset == 3
    alarms = m.observe(4, bad)[1]
    assert [a.name for a in alarms] == ["reply_repeat"] and alarms[0].step == 4
    assert "health.reply_repeat=0.9" in alarms[0].line() and "\n" not in alarms[0].line()
    assert m.active()["health/alarm_reply_repeat"] == 1.0
    assert m.observe(5, bad)[1] == []  # an alarm is announced once per run of bad steps
    assert m.observe(6, {"health/reply_repeat": 0.3})[1] == [] and m.onset is None
    assert m.active()["health/alarm_reply_repeat"] == 0.0


def test_entropy_drop_is_no_alarm_once_the_task_is_solved():
    cfg = HealthConfig(warmup_steps=1, patience=1, entropy_drop=0.2, solved_success=0.9)
    m = Monitor(cfg)
    m.observe(1, {"health/entropy": 2.0, "rollout/success": 0.1})
    extra, alarms = m.observe(2, {"health/entropy": 0.1, "rollout/success": 0.1})
    assert extra["health/entropy_ratio"] == pytest.approx(0.05) and [a.name for a in alarms] == ["entropy"]
    m = Monitor(cfg)
    m.observe(1, {"health/entropy": 2.0, "rollout/success": 0.1})
    assert m.observe(2, {"health/entropy": 0.1, "rollout/success": 1.0})[1] == []


def test_input_dependence_alarms_only_on_a_drop_from_a_reached_peak():
    cfg = HealthConfig(warmup_steps=0, patience=1, input_dependence_drop=0.3, input_dependence_min_peak=0.15)
    never = Monitor(cfg)  # an untrained policy: no dependence to lose
    assert not any(never.observe(s, {"health/input_dependence": 0.0})[1] for s in range(1, 10))
    m = Monitor(cfg)
    values = [0.0, 0.6, 0.6, 0.6, 0.6, 0.9, 0.0] + [0.0] * 8  # one noisy high step, then a real loss
    fired = [step for step, v in enumerate(values, 1) if m.observe(step, {"health/input_dependence": v})[1]]
    assert fired and 8 <= fired[0] <= 12  # smoothed: not on the first low step, but within a few
    assert m.observe(99, {"health/input_dependence": 0.0})[0]["health/input_dependence_smooth"] < 0.05


def test_monitor_state_round_trips():
    m = Monitor(HealthConfig(warmup_steps=1, patience=3))
    for step in (1, 2, 3):
        m.observe(step, {"health/entropy": 1.0 / step, "health/reply_repeat": 0.95, "health/input_dependence": 0.4,
                         "health/malformed_calls": 0.0 if step == 1 else 0.9})
    twin = Monitor(HealthConfig(warmup_steps=1, patience=3))
    twin.load_state_dict(m.state_dict())
    signals = {"health/entropy": 0.01, "health/reply_repeat": 0.95, "health/input_dependence": 0.01,
               "health/malformed_calls": 0.9}
    expected = m.observe(4, signals)
    assert twin.observe(4, signals) == expected and [a.name for a in expected[1]] == ["reply_repeat", "malformed_calls"]


def test_a_checkpoint_of_the_older_monitor_resumes_its_input_dependence():
    cfg = HealthConfig(warmup_steps=0, patience=1)
    m = Monitor(cfg)
    m.load_state_dict({"steps_seen": 5, "entropy_sum": 0.0, "entropy_n": 0, "mi_ema": 0.5, "mi_peak": 0.6,
                       "streak": {}, "onset": None})
    extra, alarms = m.observe(6, {"health/input_dependence": 0.0})
    assert extra["health/input_dependence_smooth"] == pytest.approx(0.35) and alarms == []  # 0.35 >= 0.3 * 0.6
    fired = [step for step in (7, 8, 9) if m.observe(step, {"health/input_dependence": 0.0})[1]]
    assert fired == [8]  # 0.245, then 0.1715 < 0.18: as the run that wrote the checkpoint would have


@pytest.mark.parametrize("override, field", [("health.reply_repeat=1.5", "health.reply_repeat"),
                                             ("health.patience=0", "health.patience"),
                                             ("health.mi_inputs=2", "health.mi_inputs"),
                                             ("trainer.dump_max_tokens=0", "trainer.dump_max_tokens"),
                                             ("trainer.dump_trajectories_freq=-1", "trainer.dump_trajectories_freq"),
                                             ("trainer.on_collapse=halt", "trainer.on_collapse")])
def test_bad_settings_fail_in_one_line_naming_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert field in str(e.value) and "\n" not in str(e.value)
