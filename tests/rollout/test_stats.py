"""Per-tag episode summaries: env-specific per-episode metrics become env/<tag>/ and eval/<tag>/ means."""

from agentrl.agents.tool import ToolUsage
from agentrl.rollout.stats import episode_stats, partial_replies, tag_metrics
from agentrl.trajectory import Trajectory


def _traj(info, reward=1.0, **outcome):
    return Trajectory([1, 2], [0, 1], [0.0, -0.5], [-1, 0], [reward], [1], 0, 0, info, **outcome)


def test_env_metrics_average_each_numeric_key_over_the_episodes_reporting_it():
    trajs = [
        _traj({"metrics": {"steps": 4, "steps_over_optimal": 2.0, "boxes_on_target": 1.0}}),
        _traj({"metrics": {"steps": 6, "boxes_on_target": 0.0, "note": "text", "bad": float("nan")}}),
        _traj({}),  # an episode cut by max_turns reports no metrics
        _traj({"metrics": "not a dict"}),
    ]
    stats = episode_stats(trajs)
    assert {k: stats[k] for k in ("steps", "steps_over_optimal", "boxes_on_target")} == {
        "steps": 5.0, "steps_over_optimal": 2.0, "boxes_on_target": 0.5}
    assert "bad" not in stats and "note" not in stats
    assert stats["episodes"] == 4.0


def test_tag_metrics_keep_each_tags_episodes_apart():
    trajs = [_traj({}, 1.0, tag="lake", success=True), _traj({}, 0.0, tag="math"), _traj({}, 0.0, tag="lake")]
    out = tag_metrics(trajs, "eval")
    assert out["eval/lake/success"] == 0.5 and out["eval/lake/episodes"] == 2.0
    assert out["eval/math/success"] == 0.0 and out["eval/math/return"] == 0.0


def test_tool_metrics_are_per_episode_rates_of_each_tag():
    # the tool agent's per-episode counts: calls per episode, malformed, errors, timeouts, and
    # success among the episodes that called a tool and among those that did not
    episodes = [(ToolUsage(calls=2, malformed=1), True), (ToolUsage(), False), (ToolUsage(), True),
                (ToolUsage(calls=1, errors=1, timeouts=1), False)]
    trajs = [_traj({"metrics": usage.metrics(ok)}, float(ok), tag="calc", success=ok) for usage, ok in episodes]
    trajs.append(_traj({}, 1.0, tag="lake", success=True))  # another tag, no tools
    out = tag_metrics(trajs, "env")
    assert {k[len("env/calc/tools/"):]: v for k, v in out.items() if k.startswith("env/calc/tools/")} == {
        "calls": 0.75, "malformed": 0.25, "errors": 0.25, "timeouts": 0.25, "used": 0.5,
        "success_with_tool": 0.5, "success_without_tool": 0.5}
    assert out["env/calc/episodes"] == 4.0 and not any(k.startswith("env/lake/tools/") for k in out)


def test_a_reply_sampled_under_two_versions_counts_as_partial():
    # prompt, reply of versions 3 then 4 (a weight update landed mid-reply), observation, a reply of version 4
    t = Trajectory([1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 1, 1, 0, 0, 1, 1], [0.0] * 8, [-1, 3, 3, 4, -1, -1, 4, 4],
                   [0.0, 1.0], [3, 7], 0, 0)
    assert partial_replies(t) == 1
    t.versions = [-1, 4, 4, 4, -1, -1, 4, 5]  # the last reply spans the update and ends the sequence
    assert partial_replies(t) == 1
    t.versions = [-1, 4, 4, 4, -1, -1, 5, 5]  # versions differ between replies only: none is partial
    assert partial_replies(t) == 0
