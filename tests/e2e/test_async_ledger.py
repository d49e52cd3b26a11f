"""Asynchronous rollout loses no work and knows every version: a partial-rollout run on our
engine (rollout.max_staleness=1, no filters, no failures; weights reach the engine while replies
are in flight) logs rollout/discarded_tokens == 0 and rollout/version_coverage == 1.0 every step."""

from agentrl.config import load_config
from agentrl.metrics import read_jsonl
from agentrl.runtime.local import train

from test_async import ASYNC, cache  # noqa: F401  (tests/e2e is on sys.path; the shared warm start)

CAUSES = ("filtered", "stale", "failed", "aborted")


def assert_nothing_lost(rows: list[dict]) -> None:
    """Every step row: no discarded id under any cause, every trained id's version known, the
    provenance logged (a sample no older than the bound, replies spanning versions a share)."""
    assert rows
    for r in rows:
        assert r["rollout/discarded_tokens"] == 0.0, r
        assert all(r[f"rollout/discarded_tokens/{c}"] == 0.0 for c in CAUSES), r
        assert r["rollout/version_coverage"] == 1.0, r
        assert 0.0 <= r["rollout/replies_spanning_versions"] <= 1.0
        assert 0.0 <= r["rollout/staleness_mean"] <= r["rollout/staleness_max"] <= 1.0


def test_a_partial_rollout_run_on_our_engine_loses_no_token(tmp_path, cache):  # noqa: F811
    cfg = load_config("configs/frozen_lake.yaml", [*ASYNC, "rollout.max_staleness=1", "trainer.test_freq=0", "rollout.max_new_tokens=48",
                                                   f"run_dir={tmp_path}", f"model.cache_dir={cache}"])
    assert cfg.engine.kind == "local" and not cfg.algorithm.filter_groups.enable
    assert cfg.rollout.rollout_filter_ratio >= 1.0 and cfg.rollout.on_truncation != "drop"
    train(cfg, log=lambda m: None)
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "rollout/kept_groups" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert_nothing_lost(rows)
    print("replies spanning versions per step:", [r["rollout/replies_spanning_versions"] for r in rows])


def test_a_weight_update_landing_mid_reply_loses_no_token_and_stamps_both_versions(tiny_model, tiny_tokenizer):
    """The same on a schedule that does not depend on timing: our engine plays a FrozenLake
    group in one event loop and new weights land after a fixed number of its steps, inside a
    reply; the step filled from it discards nothing, knows every version, and sees the reply
    that spans the update."""
    import asyncio
    import copy

    import torch

    from agentrl.agents.chat import ChatAgent
    from agentrl.envs.frozen_lake import FrozenLakeEnv
    from agentrl.llm.engine import SamplingParams
    from agentrl.llm.local.engine import LocalEngine
    from agentrl.rollout.collector import RolloutCollector
    from agentrl.rollout.filters import groups_of
    from agentrl.rollout.source import fill_step
    from agentrl.rollout.tasks import make_tasks

    engine = LocalEngine(copy.deepcopy(tiny_model), eos_token_ids=(), pad_token_id=tiny_tokenizer.pad_token_id,
                         seed=0)
    new = {k: v + 0.01 * torch.randn(v.shape, generator=torch.Generator().manual_seed(0)) if v.is_floating_point()
           else v for k, v in tiny_model.state_dict().items()}
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=16), max_turns=2)
    collector = RolloutCollector.single(lambda: FrozenLakeEnv(max_steps=2), agent, engine)

    async def scenario():
        played = asyncio.ensure_future(collector.acollect(make_tasks(0, 1, 1, 2)))
        for _ in range(6):  # the engine's serving loop yields once per step: the update lands mid-reply
            await asyncio.sleep(0)
        assert engine.load_weights(new) == 1
        return await played

    result = asyncio.run(scenario())
    step = fill_step(lambda attempt: (groups_of(result.trajectories), result, 0), need=1, keep=None,
                     max_batches=1, version=1)
    m = step.result.metrics()
    assert m["rollout/replies_spanning_versions"] > 0.0  # the update landed inside a reply
    assert m["rollout/discarded_tokens"] == 0.0 and m["rollout/version_coverage"] == 1.0
    assert m["rollout/staleness_max"] == 1.0
