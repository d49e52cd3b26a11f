"""Trainer helpers: env-specific per-episode metrics become rollout/ and eval/ means."""

from agentrl.rollout.trajectory import Trajectory
from agentrl.train.trainer import env_metrics


def _traj(info):
    return Trajectory([1, 2], [0, 1], [0.0, -0.5], [-1, 0], [1.0], [1], 0, 0, info)


def test_env_metrics_average_each_numeric_key_over_the_episodes_reporting_it():
    trajs = [
        _traj({"metrics": {"steps": 4, "steps_over_optimal": 2.0, "boxes_on_target": 1.0}}),
        _traj({"metrics": {"steps": 6, "boxes_on_target": 0.0, "note": "text", "bad": float("nan")}}),
        _traj({"success": False}),  # an episode cut by max_turns reports no metrics
        _traj({"metrics": "not a dict"}),
    ]
    assert env_metrics(trajs) == {"steps": 5.0, "steps_over_optimal": 2.0, "boxes_on_target": 0.5}
    assert env_metrics([]) == {}
