"""End-to-end: `env.type=openenv` trains the embedded model 3 steps against a real openenv-core server that
the run serves itself (env.args.app: a game whose one free text field any reply fills), logs the random
policy's reference, trains the engine's ids as sampled, and every reward it trained on is the server's own
for the same action."""

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="openenv-core is not installed (pip install 'agentrl[openenv]')")

from openenv.core.generic_client import GenericEnvClient  # noqa: E402
from test_textarena_train import TINY  # noqa: E402  (tests/e2e is on sys.path)

from agentrl.config import load_config  # noqa: E402
from agentrl.dumps import list_dumps, read_dump  # noqa: E402
from agentrl.envs.openenv_schema import ActionFields  # noqa: E402
from agentrl.envs.openenv_serve import served_urls  # noqa: E402
from agentrl.metrics import read_jsonl  # noqa: E402
from agentrl.runtime.local import train  # noqa: E402

STOPS = ("<|im_end|>", "<|endoftext|>")  # the tiny tokenizer's end of a reply
APPS = Path(__file__).parents[1] / "envs" / "openenv_apps.py"
APP = f"{APPS}:say_app"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One 3-step run (the module's only one): its folder, summary and metrics rows."""
    tmp = tmp_path_factory.mktemp("openenv")
    cfg = load_config(None, [*TINY, "env.type=openenv", f"env.args.app={APP}", "env.args.sessions=8",
                             "env.max_turns=3", "rollout.max_new_tokens=16", f"run_dir={tmp / 'run'}",
                             f"model.cache_dir={tmp / 'cache'}"])
    summary = train(cfg, log=lambda m: None)
    return tmp / "run", summary, read_jsonl(tmp / "run" / "metrics.jsonl")


def test_openenv_trains_three_steps_against_its_reference(run):
    folder, summary, rows = run
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3]
    evals = [r for r in rows if "eval/success" in r]
    assert [r["step"] for r in evals] == [0, 3]
    # the random policy on the evaluated seeds: the same at every evaluation
    assert len({r["eval/baseline_random"] for r in evals}) == 1 and 0.0 < evals[0]["eval/baseline_random"] < 1.0
    assert summary["eval_baseline_random"] == evals[-1]["eval/baseline_random"]
    assert all("rollout/invalid_actions" in r for r in rows if "reward/mean" in r)


def test_the_trained_ids_are_the_engines_and_the_rewards_the_servers(run):
    folder = run[0]
    dumps = [read_dump(path) for _, path in list_dumps(folder)]
    assert len(dumps) == 3
    episodes = [(ep, dump["pieces"]) for dump in dumps for ep in dump["episodes"]]
    for ep, _ in episodes:
        generated = [k for k, m in enumerate(ep["mask"]) if int(m)]
        assert generated and len(ep["lp"]) == len(ep["old"]) == len(generated)
        assert all(abs(a - b) < 1e-3 for a, b in zip(ep["lp"], ep["old"]))
    # replies reached the server, which paid them as it pays openenv-core's own client (the others were cut
    # off at max_new_tokens: no answer, the format penalty)
    assert asyncio.run(_replayed(served_urls()[APP], episodes)) >= 1


async def _replayed(url, episodes) -> int:
    """Replay each episode's replies (the dump's pieces of each turn's ids) on the server with openenv-core's
    own client; each turn's reward must be the server's (or the format penalty for an invalid reply)."""
    fields, paid = None, 0
    async with GenericEnvClient(base_url=url) as client:
        fields = fields or ActionFields((await _schema(url))["action"])
        for ep, pieces in episodes:
            await client.reset(seed=ep["env_seed"])
            for reply, reward in zip(_replies(ep, pieces), ep["rewards"]):
                action, _ = fields.parse(reply)
                if action is None:  # an empty reply: the format penalty, never sent
                    assert reward == pytest.approx(-0.1)
                    continue
                result = await client.step(action)
                assert reward == pytest.approx(result.reward or 0.0, abs=1e-6)
                paid += 1
                if result.done:
                    break
    return paid


def _replies(ep, pieces) -> list[str]:
    """Each turn's reply as the env got it: the pieces of its run of generated ids up to the stop id, or ""
    for a reply cut off at max_new_tokens (the agent sends no answer then)."""
    turns, current = [], []
    for k, (token, m) in enumerate(zip(ep["ids"], ep["mask"])):
        if m == "1":
            current.append(pieces[str(token)])
        if current and (m == "0" or k == len(ep["ids"]) - 1):
            turns.append("".join(current[:-1]) if current[-1] in STOPS else "")
            current = []
    return turns


async def _schema(url):
    import httpx

    async with httpx.AsyncClient(base_url=url, trust_env=False) as http:
        return (await http.get("/schema")).json()
