"""The task source: which env seeds, groups and tags every part of a run plays."""

import pytest

from agentrl.rollout.tasks import DEMO_SEED_BASE, EVAL_SEED_BASE, TaskSource, make_tasks

SOURCE = TaskSource(seed=0, group_size=2, train_tags=("lake", "math", "lake"), val_tags=("lake", "math", "math"))


def test_a_step_is_n_groups_of_group_size_episodes_sharing_an_env_seed():
    tasks = SOURCE.step(1)
    assert SOURCE.n_groups == 3 and len(tasks) == 6
    assert [t.group_id for t in tasks] == [0, 0, 1, 1, 2, 2]
    assert [t.tag for t in tasks] == ["lake", "lake", "math", "math", "lake", "lake"]
    for g in range(3):
        a, b = tasks[2 * g], tasks[2 * g + 1]
        assert a.env_seed == b.env_seed and a.sampling_seed != b.sampling_seed
    assert len({t.env_seed for t in tasks}) == 3 and all(t.env_seed < EVAL_SEED_BASE for t in tasks)
    assert not any(t.greedy for t in tasks)


def test_seeds_are_pinned_so_every_run_with_a_seed_plays_the_same_tasks():
    # A change of the hash would silently change every run's tasks (and break resumed runs).
    tasks = TaskSource(0, 2, ("a", "b")).step(1)
    assert [(t.env_seed, t.sampling_seed) for t in tasks] == [
        (213246, 6454833514026709402), (213246, 4125385873750205559),
        (709402, 4427851213832895308), (709402, 2098403573556391464)]
    assert tasks == TaskSource(0, 2, ("a", "b")).step(1)
    assert [t.env_seed for t in TaskSource(1, 2, ("a", "b")).step(1)] != [t.env_seed for t in tasks]
    assert [t.env_seed for t in TaskSource(0, 2, ("a", "b")).step(2)] != [t.env_seed for t in tasks]


def test_a_further_generation_batch_has_fresh_seeds_and_group_ids_of_its_own():
    first, second = SOURCE.step(4), SOURCE.step(4, attempt=1)
    assert [t.group_id for t in second] == [3, 3, 4, 4, 5, 5]
    assert not {t.env_seed for t in first} & {t.env_seed for t in second}
    assert [t.tag for t in second] == [t.tag for t in first]


@pytest.mark.parametrize("index", [0, 2, 3, 7])
def test_stream_group_n_plays_what_on_policy_step_n_over_groups_plus_one_plays(index):
    step, g = divmod(index, SOURCE.n_groups)
    on_policy = SOURCE.step(step + 1)[2 * g:2 * g + 2]
    streamed = SOURCE.group(index)
    assert [t.group_id for t in streamed] == [index, index]
    assert [(t.env_seed, t.sampling_seed, t.tag) for t in streamed] == [
        (t.env_seed, t.sampling_seed, t.tag) for t in on_policy]


def test_evaluation_is_greedy_held_out_and_the_same_every_time():
    tasks = SOURCE.evaluation()
    assert [t.tag for t in tasks] == ["lake", "math", "math"] and all(t.greedy for t in tasks)
    assert all(EVAL_SEED_BASE <= t.env_seed < DEMO_SEED_BASE for t in tasks)
    assert [t.group_id for t in tasks] == [0, 1, 2]  # one episode per group
    assert tasks == SOURCE.evaluation()


def test_demonstrations_lie_apart_from_training_and_evaluation():
    tasks = SOURCE.demonstrations(3, ["lake", "math"])
    assert [t.tag for t in tasks] == ["lake", "math"] and all(t.env_seed >= DEMO_SEED_BASE for t in tasks)
    assert tasks != SOURCE.demonstrations(4, ["lake", "math"])


def test_make_tasks_needs_one_tag_per_group():
    with pytest.raises(ValueError, match="2 tags for 3 groups"):
        make_tasks(0, 1, 3, 2, tags=["a", "b"])


def test_remax_groups_end_with_a_greedy_episode_of_their_env_seed():
    source = TaskSource(seed=0, group_size=2, train_tags=("lake", "math"), greedy_baselines=True)
    plain = TaskSource(seed=0, group_size=2, train_tags=("lake", "math"))
    for step, attempt in [(1, 0), (3, 1)]:
        tasks, sampled = source.step(step, attempt), plain.step(step, attempt)
        assert len(tasks) == 6 and [t for t in tasks if not t.baseline] == sampled  # sampled ones unchanged
        for g in range(2):
            group = tasks[3 * g:3 * g + 3]
            assert [t.baseline for t in group] == [False, False, True] and group[2].greedy
            assert len({(t.env_seed, t.group_id, t.tag) for t in group}) == 1
    # the stream plays the same groups, its greedy episode included
    assert [t.baseline for t in source.group(3)] == [False, False, True]
    assert [(t.env_seed, t.sampling_seed) for t in source.group(3)] == [
        (t.env_seed, t.sampling_seed) for t in source.step(2)[3:6]]
    assert not any(t.baseline for t in source.evaluation())
