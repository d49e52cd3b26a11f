"""The one token record: prompt ids, generated ids, turn rewards; and the typed trajectory built from it."""

import pytest

from agentrl.trajectory import Task, TokenRecord, Trajectory


def test_the_record_aligns_ids_mask_logprobs_versions_and_places_rewards_on_the_last_generated_id():
    r = TokenRecord()
    r.append_prompt([10, 11])
    r.append_generated([20, 21], [-0.5, -0.25], [3, 4])
    r.set_turn_reward(1.5)
    r.append_prompt([12])
    r.append_generated([], [], [])  # an empty reply keeps the previous turn's position
    r.append_generated([22], [-1.0], [4])
    assert r.token_ids == [10, 11, 20, 21, 12, 22]
    assert r.loss_mask == [0, 0, 1, 1, 0, 1] and r.num_generated == 3
    assert r.logprobs == [0.0, 0.0, -0.5, -0.25, 0.0, -1.0]
    assert r.versions == [-1, -1, 3, 4, -1, 4]
    assert r.rewards == [1.5, 0.0, 0.0] and r.reward_positions == [3, 3, 5]


def test_truncate_drops_only_text_we_wrote():
    r = TokenRecord()
    r.append_prompt([1])
    r.append_generated([2], [-0.1], [0])
    r.append_prompt([3, 4])
    r.truncate(2)
    assert r.token_ids == [1, 2] and r.loss_mask == [0, 1]
    with pytest.raises(AssertionError, match="generated"):
        r.truncate(1)
    with pytest.raises(AssertionError, match="before any completion"):
        TokenRecord().set_turn_reward(1.0)


def test_a_trajectory_from_a_record_carries_the_task_and_its_typed_outcome():
    r = TokenRecord()
    r.append_prompt([1])
    r.append_generated([2], [-0.1], [0])
    r.set_turn_reward(1.0)
    task = Task(env_seed=7, group_id=3, sampling_seed=9, tag="lake")
    t = Trajectory.from_record(r, task, ["state"], success=True, terminated=False, truncation_reason="max_turns",
                               info={"metrics": {"steps": 1}})
    assert (t.group_id, t.env_seed, t.tag, t.turn_states) == (3, 7, "lake", ["state"])
    assert t.success and t.truncated and t.truncation_reason == "max_turns"
    assert t.total_reward == 1.0 and t.num_turns == 1 and t.num_generated == 1
    assert t.info == {"metrics": {"steps": 1}} and t.reset_info == {}


def test_turn_rewards_are_added_to_or_replaced_through_the_record():
    rec = TokenRecord()
    rec.append_prompt([1])
    rec.append_generated([2], [-0.1], [0])
    rec.add_turn_reward(0.5)
    rec.add_turn_reward(0.25)  # a second env step after the same reply adds to it
    rec.append_generated([3], [-0.2], [0])
    assert rec.rewards == [0.75, 0.0]
    rec.set_rewards([1, 2])  # an agent's own shaping, one per turn
    assert rec.rewards == [1.0, 2.0] and all(isinstance(r, float) for r in rec.rewards)
    with pytest.raises(AssertionError, match="1 rewards for 2 turns"):
        rec.set_rewards([1.0])
    with pytest.raises(AssertionError, match="before any completion"):
        TokenRecord().add_turn_reward(1.0)
