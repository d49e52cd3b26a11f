"""Group filters (DAPO's dynamic sampling, RAGEN's variance filter) and how a step is filled."""

import pytest

from agentrl.rollout.collector import CollectResult
from agentrl.rollout.filters import groups_of, informative_groups, top_variance_groups
from agentrl.rollout.source import fill_step
from agentrl.trajectory import Trajectory


def _t(group, reward, success=False):
    return Trajectory([1, 2], [0, 1], [0.0, -0.5], [-1, 0], [reward], [1], group, group, success=success)


def _groups(*rewards):
    return [[_t(g, r, r > 0) for r in rs] for g, rs in enumerate(rewards)]


def test_groups_of_keeps_the_order_of_first_appearance():
    trajs = [_t(5, 0.0), _t(2, 1.0), _t(5, 1.0), _t(2, 0.0)]
    assert [[t.group_id for t in g] for g in groups_of(trajs)] == [[5, 5], [2, 2]]


def test_dapo_drops_groups_whose_episodes_all_scored_the_same():
    groups = _groups([0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.5, 1.0])
    assert informative_groups(groups, "reward") == [groups[0], groups[3]]
    # By success, 0.5 and 1.0 are both successes: that group is not informative.
    assert informative_groups(groups, "success") == [groups[0]]


def test_dapo_rounds_returns_so_float_noise_is_no_difference():
    groups = [[_t(0, 0.1 + 0.2), _t(0, 0.3)]]
    assert informative_groups(groups, "reward") == []


def test_ragen_keeps_the_highest_variance_fraction_in_order():
    # sample stds: 0.707, 0, 1.414, 0
    groups = _groups([0.0, 1.0], [0.0, 0.0], [0.0, 2.0], [1.0, 1.0])
    assert top_variance_groups(groups, 0.5) == [groups[0], groups[2]]
    assert top_variance_groups(groups, 0.25) == [groups[2]]
    assert top_variance_groups(groups, 0.01) == [groups[2]]  # at least one group
    assert top_variance_groups(groups, 1.0) == groups


def test_ragen_ties_keep_the_earlier_group_and_single_episode_groups_have_no_variance():
    tied = _groups([0.0, 1.0], [1.0, 0.0])
    assert top_variance_groups(tied, 0.5) == [tied[0]]
    singles = _groups([3.0], [0.0, 1.0])
    assert top_variance_groups(singles, 0.5) == [singles[1]]
    assert top_variance_groups([], 0.5) == []


def _batches(*batches):
    """next_batch over fixed generation batches; each a list of reward lists."""
    def next_batch(attempt):
        groups = _groups(*batches[attempt])
        return groups, CollectResult([t for g in groups for t in g], episodes=2 * len(groups), retries=attempt), 1
    return next_batch


def test_a_step_is_filled_from_further_batches_until_it_has_its_groups():
    dropped = []
    step = fill_step(_batches([[1, 1], [0, 1]], [[0, 0], [1, 0], [0, 1]]), need=2,
                     keep=lambda gs: informative_groups(gs, "reward"), max_batches=3, on_dropped=dropped.append)
    assert len(step.groups) == 2 and step.groups[1][0].rewards == [1.0]  # the first of batch two
    assert dropped == [1, 1]
    assert step.stats == {"rollout/gen_batches": 2.0, "rollout/filtered_groups_equal": 2.0,
                          "rollout/stale_dropped_groups": 2.0}
    assert step.result.episodes == 10 and step.result.retries == 1  # every batch played is counted
    assert step.result.trajectories == [t for g in step.groups for t in g]


@pytest.mark.parametrize("max_batches", [0, 1])
def test_without_further_batches_a_step_trains_on_what_passed(max_batches):
    step = fill_step(_batches([[1, 1], [0, 1]], [[0, 1]]), need=2,
                     keep=lambda gs: informative_groups(gs, "reward"), max_batches=max_batches)
    assert len(step.groups) == 1 and step.stats["rollout/gen_batches"] == 1.0


def test_without_a_filter_every_group_counts():
    step = fill_step(_batches([[1, 1], [0, 1], [0, 0]]), need=2, keep=None, max_batches=4)
    assert len(step.groups) == 2 and step.stats["rollout/filtered_groups_equal"] == 0.0


def test_remax_greedy_episodes_leave_their_groups_and_become_the_baseline():
    from dataclasses import replace

    from agentrl.rollout.filters import split_greedy_baselines

    groups = _groups([0.0, 1.0], [1.0, 1.0], [0.5])
    groups[0].append(replace(_t(0, 0.25), baseline=True))
    groups[1].append(replace(_t(1, 1.5), baseline=True))
    split = split_greedy_baselines(groups)
    assert [len(g) for g in split] == [2, 2, 1] and not any(t.baseline for g in split for t in g)
    assert [[t.reward_baseline for t in g] for g in split] == [[0.25, 0.25], [1.5, 1.5], [None]]
    # a step filled from such batches trains on the sampled episodes only
    step = fill_step(lambda attempt: (groups, CollectResult([t for g in groups for t in g]), 0), need=3, keep=None,
                     max_batches=1)
    assert len(step.result.trajectories) == 5 and not any(t.baseline for t in step.result.trajectories)


def test_on_truncation_drop_takes_every_sequence_of_a_truncated_episode_out_of_its_group():
    from agentrl.rollout.filters import without_truncated

    done, cut = _t(0, 1.0, True), _t(0, 0.0)
    cut.truncation_reason = "max_turns"
    window = [_t(0, 0.0), _t(0, 0.0)]  # one episode played as two sequences (a history window)
    for k, t in enumerate(window):
        t.segment, t.truncation_reason = k, "token_budget"
    alone = _t(1, 0.0)
    alone.truncation_reason = "context"
    groups, dropped = without_truncated([[done, cut, *window], [alone], [_t(2, 1.0)]])
    assert groups == [[done], [groups[1][0]]] and groups[1][0].group_id == 2  # an emptied group is gone
    assert dropped == 3  # episodes, not sequences
