"""pack: trajectories of different lengths become one right-padded batch, every field in place."""

import pytest
import torch

from agentrl.train.batch import mini_batches, pack
from agentrl.trajectory import Trajectory

PAD = 0


def _trajs():
    # Two turns: generated ids at 2-3 and 5; rewards 0.5 (turn 1, at 3) and 1.0 (turn 2, at 5).
    a = Trajectory([11, 12, 13, 14, 15, 16], [0, 0, 1, 1, 0, 1], [0.0, 0.0, -0.1, -0.2, 0.0, -0.3],
                   [-1, -1, 2, 2, -1, 3], [0.5, 1.0], [3, 5], group_id=9, env_seed=1, turn_states=["s0", "s1"])
    # One turn, the same first state as a's (same group): its turn gets the same state id.
    b = Trajectory([21, 22, 23], [0, 1, 1], [0.0, -0.4, -0.5], [-1, 3, 3], [2.0], [2], group_id=9, env_seed=1,
                   turn_states=["s0"])
    # Another group, generating from position 0 (which can never be trained on).
    c = Trajectory([31, 32], [1, 1], [-0.6, -0.7], [1, 1], [-1.0], [1], group_id=4, env_seed=2, turn_states=["s0"])
    return [a, b, c]


def test_pack_right_pads_and_aligns_every_field():
    batch = pack(_trajs(), PAD)
    assert batch.size == 3 and batch.input_ids.shape == (3, 6)
    assert batch.input_ids.tolist() == [[11, 12, 13, 14, 15, 16], [21, 22, 23, PAD, PAD, PAD],
                                        [31, 32, PAD, PAD, PAD, PAD]]
    assert batch.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]]
    # Position 0 has no context to be predicted from: it is never in the loss.
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1, 0, 1], [0, 1, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0]]
    torch.testing.assert_close(batch.behaviour_logprobs[0], torch.tensor([0.0, 0.0, -0.1, -0.2, 0.0, -0.3]))
    torch.testing.assert_close(batch.behaviour_logprobs[2, :2], torch.tensor([-0.6, -0.7]))
    assert batch.versions.tolist() == [[-1, -1, 2, 2, -1, 3], [-1, 3, 3, -1, -1, -1], [1, 1, -1, -1, -1, -1]]
    assert batch.token_rewards.tolist() == [[0, 0, 0, 0.5, 0, 1.0], [0, 0, 2.0, 0, 0, 0], [0, -1.0, 0, 0, 0, 0]]
    assert batch.group_index.tolist() == [0, 0, 1]  # renumbered in order of first appearance
    # (group, state) ids on trained tokens: a's first turn and b's turn share one state.
    assert batch.state_ids.tolist() == [[-1, -1, 0, 0, -1, 1], [-1, 0, 0, -1, -1, -1], [-1, 2, -1, -1, -1, -1]]
    assert batch.old_logprobs is None and batch.advantages is None


def test_select_trims_a_sub_batch_to_its_longest_sequence():
    sub = pack(_trajs(), PAD).select(torch.tensor([1, 2]))
    assert sub.input_ids.tolist() == [[21, 22, 23], [31, 32, PAD]] and sub.group_index.tolist() == [0, 1]


def test_pack_of_nothing_is_one_clear_error():
    with pytest.raises(ValueError, match="at least one trajectory"):
        pack([], PAD)


def _segment(group, segment, n=3):
    return Trajectory(list(range(1, n + 1)), [0, 1, 1][:n], [0.0] * n, [0] * n, [1.0], [n - 1], group, 0,
                      turn_states=["s"], segment=segment)


def test_mini_batches_hold_whole_episodes_however_many_sequences_each_has():
    # episodes of 3, 1, 2 and 1 sequences: two episodes a mini-batch is rows 0-3, then rows 4-6
    segments = [0, 1, 2, 0, 0, 1, 0]
    batch = pack([_segment(g, s) for g, s in zip([0, 0, 0, 0, 1, 1, 1], segments)], pad_token_id=0)
    assert batch.episode_index.tolist() == [0, 0, 0, 1, 2, 2, 3]
    assert [m.tolist() for m in mini_batches(batch, 2)] == [[0, 1, 2, 3], [4, 5, 6]]
    assert [m.tolist() for m in mini_batches(batch, 4)] == [list(range(7))]
    # one sequence an episode: mini-batches of rows, as before
    plain = pack([_segment(0, 0) for _ in range(5)], pad_token_id=0)
    assert [m.tolist() for m in mini_batches(plain, 2)] == [[0, 1], [2, 3], [4]]
