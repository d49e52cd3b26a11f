"""Curricula (rollout.curriculum): draws prefer informative tasks, keep a uniform floor, follow the
estimates a checkpoint keeps, and a bad setting is one line. Statistics are over fixed seeds:
deterministic, never flaky."""

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.rollout.curriculum import Curriculum, informative
from agentrl.rollout.tasks import EVAL_SEED_BASE, TaskSource
from agentrl.trajectory import Trajectory

ROOT = Path(__file__).parents[2]


def _group(seed: int, successes: int, size: int = 4, tag: str = "a") -> list[Trajectory]:
    """A played group of env seed `seed` in which `successes` of `size` episodes succeeded."""
    return [Trajectory([1, 2], [0, 1], [0.0, -0.5], [-1, 0], [1.0], [1], 0, seed, success=k < successes, tag=tag)
            for k in range(size)]


def _curriculum(**kw) -> Curriculum:
    return Curriculum(seed=0, group_size=4, tags=["a"], pool_size=kw.pop("pool_size", 100), **kw)


def _shaped(c: Curriculum) -> tuple[set[int], set[int]]:
    """Tasks 0-9 half solved (informative), 10-59 always solved, 60-99 never seen."""
    c.observe([_group(c.seeds[i], 2) for i in range(10)] + [_group(c.seeds[i], 4) for i in range(10, 60)])
    return set(c.seeds[:10]), set(c.seeds[10:60])


def _draws(source: TaskSource, steps: range) -> list[int]:
    return [t.env_seed for s in steps for t in source.step(s)[::source.group_size]]


def test_draws_prefer_informative_tasks_and_keep_a_uniform_floor():
    c = _curriculum(uniform_ratio=0.25)
    informative_tasks, solved = _shaped(c)
    source = TaskSource(0, 4, ("a",) * 8, curriculum=c)
    drawn = _draws(source, range(1, 401))  # 3200 groups, no estimate changes meanwhile
    share = Counter("informative" if s in informative_tasks else "solved" if s in solved else "unseen" for s in drawn)
    # Weighted draws (3/4) all land on the 10 informative tasks; uniform ones (1/4) spread over all 100.
    assert 0.75 < share["informative"] / len(drawn) < 0.85
    assert 0.10 < share["solved"] / len(drawn) < 0.15 and 0.07 < share["unseen"] / len(drawn) < 0.13
    assert set(drawn) == set(c.seeds)  # the floor reaches every task, seen or not
    stats = c.pop_stats()
    assert 0.72 < stats["curriculum/pool_draws"] < 0.78
    assert stats["curriculum/informative_tasks"] == 10 and stats["curriculum/easy_tasks"] == 50
    assert stats["curriculum/unseen_tasks"] == 40 and stats["curriculum/hard_tasks"] == 0
    assert c.pop_stats()["curriculum/pool_draws"] == 0.0  # popped: the next step counts its own draws


def test_without_a_curriculum_every_group_plays_a_fresh_seed():
    plain, off = TaskSource(0, 4, ("a",) * 8), TaskSource(0, 4, ("a",) * 8, curriculum=None)
    assert plain.step(3) == off.step(3)
    drawn = _draws(plain, range(1, 51))
    assert len(set(drawn)) == len(drawn)


def test_the_rule_weighs_tasks_by_the_chance_of_a_mixed_group():
    c = _curriculum(uniform_ratio=0.0)
    c.observe([_group(c.seeds[0], 2), _group(c.seeds[1], 3), _group(c.seeds[2], 0), _group(c.seeds[3], 4)])
    drawn = Counter(_draws(TaskSource(0, 4, ("a",), curriculum=c), range(1, 2001)))
    # p = 1/2 -> 1 - 2/16 = 0.875; p = 3/4 -> 1 - 81/256 - 1/256 = 0.68; p = 0 or 1 -> never.
    assert informative(0.5, 1, 4) == pytest.approx(0.875) and informative(0.75, 1, 4) == pytest.approx(0.6796875)
    assert set(drawn) == {c.seeds[0], c.seeds[1]}
    assert 0.53 < drawn[c.seeds[0]] / 2000 < 0.59  # 0.875 / (0.875 + 0.68) = 0.56


def test_a_registered_rule_decides_the_weighted_draws():
    def only_hard_ones(estimate: float, seen: int, group_size: int) -> float:
        return 1.0 if estimate < 0.3 else 0.0

    c = Curriculum(0, 4, ["a"], pool_size=50, uniform_ratio=0.0, rule=only_hard_ones)
    c.observe([_group(c.seeds[0], 1), _group(c.seeds[1], 3)])  # estimates 1/4 and 3/4
    assert set(_draws(TaskSource(0, 4, ("a",), curriculum=c), range(1, 30))) == {c.seeds[0]}


def test_the_estimate_is_an_ema_of_group_success_rates():
    c = _curriculum(ema=0.5)
    seed = c.seeds[7]
    for successes in (4, 0, 2):  # rates 1, 0, 1/2: 1 -> 0.5 -> 0.5
        c.observe([_group(seed, successes)])
    assert c.estimates["a"][7] == (0.5, 3)
    c.observe([_group(seed, 4)])
    assert c.estimates["a"][7] == (0.75, 4)
    c.observe([_group(123_456_789, 4)])  # not a pool task (an env seed the pool never drew): ignored
    assert sum(n for _, n in c.estimates["a"].values()) == 4


def test_a_task_is_drawn_once_per_batch_while_others_are_left():
    c = _curriculum(pool_size=8, uniform_ratio=1.0)
    source = TaskSource(0, 4, ("a",) * 8, curriculum=c)
    for step in range(1, 20):
        assert sorted(_draws(source, range(step, step + 1))) == sorted(c.seeds)


def test_each_tag_has_its_own_estimates():
    c = Curriculum(0, 4, ["a", "b"], pool_size=20, uniform_ratio=0.0)
    c.observe([_group(c.seeds[3], 2, tag="a"), _group(c.seeds[5], 2, tag="b")])
    tasks = TaskSource(0, 4, ("a", "b"), curriculum=c).step(1)
    assert [(t.tag, t.env_seed) for t in tasks[::4]] == [("a", c.seeds[3]), ("b", c.seeds[5])]


def test_pool_seeds_are_distinct_training_seeds_and_evaluation_is_untouched():
    c = _curriculum(pool_size=5000)
    assert len(set(c.seeds)) == 5000 and all(0 <= s < EVAL_SEED_BASE for s in c.seeds)
    assert TaskSource(0, 4, ("a",), curriculum=c).evaluation() == TaskSource(0, 4, ("a",)).evaluation()


def _play(source: TaskSource, steps: range) -> list[list]:
    """Each step's tasks; each group then 'plays' with a success count fixed by its step."""
    out = []
    for s in steps:
        tasks = source.step(s)
        source.observe([_group(t.env_seed, s % 5) for t in tasks[::source.group_size]])
        out.append(tasks)
    return out


def test_a_restored_curriculum_draws_what_the_straight_one_draws():
    straight = _curriculum(uniform_ratio=0.25)
    _shaped(straight)
    source = TaskSource(0, 4, ("a",) * 4, curriculum=straight)
    _play(source, range(1, 6))
    resumed = _curriculum(uniform_ratio=0.25)
    resumed.load_state_dict(straight.state_dict())  # what a checkpoint keeps
    again = TaskSource(0, 4, ("a",) * 4, curriculum=resumed)
    later = _play(source, range(6, 16))
    assert _play(again, range(6, 16)) == later and resumed.estimates == straight.estimates
    fresh = TaskSource(0, 4, ("a",) * 4, curriculum=_curriculum(uniform_ratio=0.25))
    assert _play(fresh, range(6, 16)) != later  # the estimates steer the draws


@pytest.mark.parametrize("override, message", [
    ("rollout.curriculum.uniform_ratio=1.5",
     "rollout.curriculum.uniform_ratio=1.5 is too large; at most 1 is accepted"),
    ("rollout.curriculum.ema=0", "rollout.curriculum.ema=0.0 must be > 0 (at most 1)"),
    ("rollout.curriculum.pool_size=0", "rollout.curriculum.pool_size=0 must be a positive integer"),
    ("rollout.curriculum.rule=informatve", "unknown curriculum rule 'informatve'. Did you mean 'informative'?"),
])
def test_a_bad_value_is_one_line_naming_the_field(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rollout.curriculum.enable=true", override])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_thresholds_out_of_order_and_rollouts_it_cannot_steer_are_one_line():
    with pytest.raises(ConfigError, match=r"hard_threshold=0.8 must be below rollout.curriculum.easy_threshold=0.2"):
        load_config(None, ["rollout.curriculum.hard_threshold=0.8", "rollout.curriculum.easy_threshold=0.2"])
    with pytest.raises(ConfigError, match=r"rollout.curriculum.enable=true with rollout.max_staleness=1"):
        load_config(None, ["rollout.curriculum.enable=true", "rollout.max_staleness=1"])
    load_config(None, ["rollout.max_staleness=1"])  # off, the curriculum asks nothing of the rollout


def test_the_cli_refuses_a_bad_curriculum_in_one_line_with_exit_2(tmp_path):
    res = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "rollout.curriculum.enable=true",
                          "rollout.curriculum.easy_threshold=0", f"run_dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().count("\n") == 0 and "rollout.curriculum.hard_threshold=0.0" in res.stderr
    assert not (tmp_path / "run").exists()


def test_a_rule_from_imports_is_found_and_an_unknown_one_named_after_importing(tmp_path, capsys):
    """`agentrl plan` through the CLI's entry point, in this process (the refusal's process exit is
    the test above's): the unknown name first, so that the rule it suggests can only come from the
    file that very command imported (this process registers it nowhere else)."""
    from agentrl.cli import main

    module = tmp_path / "my_rules.py"
    module.write_text("from agentrl.registry import register_curriculum_rule\n"
                      "@register_curriculum_rule('hardest_first')\n"
                      "def hardest_first(estimate, seen, group_size):\n    return 1.0 - estimate\n")
    plan = ["plan", f"imports=[{module}]", "rollout.curriculum.enable=true", f"run_dir={tmp_path / 'run'}"]
    capsys.readouterr()
    assert main([*plan, "rollout.curriculum.rule=hardest"]) == 2
    bad = capsys.readouterr().err
    assert bad.strip().count("\n") == 0
    assert "rollout.curriculum.rule: unknown curriculum rule 'hardest'. Did you mean 'hardest_first'?" in bad
    code = main([*plan, "rollout.curriculum.rule=hardest_first"])
    ok = capsys.readouterr()
    assert code == 0, ok.err[-2000:]
    assert "by rule hardest_first" in ok.out + ok.err
