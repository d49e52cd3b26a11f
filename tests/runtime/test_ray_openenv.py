"""env.type=openenv on the Ray runtime: the env manager serves the app (env.args.app) in its own process
and holds its own sessions; every logged value equals the local run's of the same config."""

from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("openenv", reason="openenv-core is not installed (pip install 'agentrl[openenv]')")

from test_ray_features import _differ  # noqa: E402
from test_ray_runtime import ENGINE_LOGPROB_KEYS, TINY, _rows, cache, cluster  # noqa: E402,F401  (fixtures)

from agentrl.api import fit  # noqa: E402

pytestmark = pytest.mark.ray

APP = f"{Path(__file__).parents[1] / 'envs' / 'openenv_apps.py'}:say_app"


def test_openenv_logs_the_local_runs_values_on_ray(cluster, cache, tmp_path):  # noqa: F811
    overrides = [*TINY, "env.type=openenv", f"env.args.app={APP}", "env.args.sessions=4", "env.max_turns=3",
                 "rollout.max_new_tokens=16", f"model.cache_dir={cache}"]
    for kind in ("local", "ray"):
        fit(None, overrides=[*overrides, f"run_dir={tmp_path / kind}", f"runtime.kind={kind}"], log=lambda m: None)
    rows = _rows(tmp_path / "ray")
    assert any(r.get("eval/baseline_random") is not None for r in rows)
    # Episodes reach the engine as the server answers their sessions, so which requests share a batch,
    # and with it the engine's logprobs' last bits, depends on arrival (as for test_ray_features.py's
    # OpenAI-client sessions); sampled ids, rewards and every other value cannot differ.
    assert _differ(tmp_path / "ray", tmp_path / "local", skip=ENGINE_LOGPROB_KEYS) == []
    for mine, theirs in zip(rows, _rows(tmp_path / "local")):
        assert all(mine[k] == pytest.approx(theirs[k], abs=1e-6) for k in ENGINE_LOGPROB_KEYS if k in mine)
