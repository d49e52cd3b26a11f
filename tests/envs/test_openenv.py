"""OpenEnv servers through env.type=openenv: real openenv-core apps (tests/envs/openenv_apps.py) served on
loopback, over WebSocket sessions and plain HTTP: the server's own rewards, seeds, schema-driven parsing,
the overrides, server errors and silences, bad arguments in one line, and the app served and stopped."""

import asyncio
import random
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="openenv-core is not installed (pip install 'agentrl[openenv]')")

import httpx  # noqa: E402
import openenv_apps  # noqa: E402  (tests/envs is on sys.path)
from openenv.core.generic_client import GenericEnvClient  # noqa: E402

from agentrl.cli import main as cli_main  # noqa: E402
from agentrl.envs.checker import check_env  # noqa: E402
from agentrl.envs.openenv import OpenEnvEnv  # noqa: E402
from agentrl.envs.openenv_schema import ActionFields  # noqa: E402
from agentrl.envs.openenv_serve import serve_app, served_urls, stop_apps  # noqa: E402
from agentrl.errors import ConfigError, EnvError  # noqa: E402

APPS = f"{Path(openenv_apps.__file__)}"
MOVES = ["<answer>up 1</answer>", "<answer>right 2</answer>", "<answer>down 2</answer>", "<answer>left 1</answer>",
         "<answer>down 1</answer>", "<answer>right 1</answer>", "<answer>up 2</answer>"]


@pytest.fixture(scope="module")
def urls():
    """The WebSocket app's and the HTTP-only app's URLs, served on loopback for this module."""
    out = {name: serve_app(f"{APPS}:{name}", 30.0) for name in ("ws_app", "http_app")}
    yield out
    openenv_apps.RELEASE.set()
    for name in out:
        stop_apps(f"{APPS}:{name}")


async def _play(env, seed, replies):
    obs, _ = await env.reset(seed=seed)
    out = [obs]
    for reply in replies:
        obs, reward, terminated, truncated, info = await env.step(reply)
        out.append((obs, reward, terminated, info.get("action_valid"), info.get("success")))
        if terminated:
            break
    env.close()
    return out


async def _theirs(url, seed, actions):
    """The server driven with openenv-core's own client: (observation, reward, done) per step."""
    async with GenericEnvClient(base_url=url) as client:
        first = await client.reset(seed=seed)
        out = [(first.observation, first.reward, first.done)]
        for action in actions:
            r = await client.step(action)
            out.append((r.observation, r.reward, r.done))
            if r.done:
                break
    return out


@pytest.mark.parametrize("seed", [0, 3, 11])
async def test_observations_rewards_and_ends_are_the_servers_own(urls, seed):
    env = OpenEnvEnv(url=urls["ws_app"])
    assert env.info.transport == "websocket"
    ours = await _play(env, seed, MOVES)
    fields = ActionFields(env.info.action_schema)
    theirs = await _theirs(urls["ws_app"], seed, [fields.parse(m)[0] for m in MOVES])
    assert len(ours) == len(theirs)
    assert ours[0] == "\n".join(f"{k}: {v}" for k, v in theirs[0][0].items())
    for (obs, reward, terminated, valid, success), (their_obs, their_reward, done) in zip(ours[1:], theirs[1:]):
        assert obs == "\n".join(f"{k}: {v}" for k, v in their_obs.items())
        assert (reward, terminated, valid) == (their_reward, done, True)
        assert success is (None if not done else their_reward >= 1.0)


async def test_a_seed_replays_its_episode_and_sessions_share_nothing(urls):
    a, b, c = (OpenEnvEnv(url=urls["ws_app"], sessions=3) for _ in range(3))
    first, second, other = await asyncio.gather(_play(a, 5, MOVES), _play(b, 5, MOVES), _play(c, 6, MOVES))
    assert first == second and first[0] != other[0]


async def test_http_without_sessions_plays_episodes_in_turn(urls):
    env = OpenEnvEnv(url=urls["http_app"], sessions=4)
    assert (env.info.transport, env.sessions) == ("http", 1)
    ours = await asyncio.gather(*(_play(OpenEnvEnv(url=urls["http_app"]), 3, MOVES) for _ in range(3)))
    assert ours[0] == ours[1] == ours[2] == await _play(OpenEnvEnv(url=urls["ws_app"]), 3, MOVES)


def test_the_server_passes_check_env(urls):
    assert check_env(lambda: OpenEnvEnv(url=urls["ws_app"]))["episodes"] == 9


def test_the_reply_format_comes_from_the_servers_action_schema(urls):
    fields = OpenEnvEnv(url=urls["ws_app"]).fields
    ok = {"direction": "up", "steps": 2}
    for reply in ("<answer>up 2</answer>", "up 2", "<answer>direction=up; steps=2</answer>",
                  '<answer>{"direction": "up", "steps": 2}</answer>', "<answer>UP 2</answer>"):
        assert fields.parse(reply) == (ok, ""), reply
    for reply, why in [("<answer>up 3</answer>", "out of range"), ("<answer>north 1</answer>", "not one of"),
                       ("<answer>up</answer>", "write the fields as direction steps"),
                       ("<answer>direction=up</answer>", "missing field 'steps'"),
                       ('<answer>{"direction": "up", "steps": 1, "speed": 2}</answer>', "'speed' is not a field"),
                       ("<answer>up 1.5</answer>", "not an integer"), ("x" * 10_000, "longer than")]:
        got, reason = fields.parse(reply)
        assert got is None and why in reason, (reply, reason)
    rng = random.Random(0)
    replies = {fields.reply(fields.sample(rng)) for _ in range(200)}
    assert len(replies) == 8 and all(fields.parse(r)[0] is not None for r in replies)  # 4 directions x 2 counts


def test_a_single_field_optional_and_enum_schema():
    schema = {"properties": {"metadata": {"type": "object"}, "guess": {"type": "integer", "minimum": 1, "maximum": 9},
                             "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}},
              "required": ["guess"]}
    fields = ActionFields(schema)
    assert fields.parse("<answer>7</answer>") == ({"guess": 7}, "")
    assert fields.parse("<answer>guess=7; note=hi</answer>") == ({"guess": 7, "note": "hi"}, "")
    assert fields.parse("<answer>10</answer>")[0] is None
    assert fields.reply({"guess": 4}) == "<answer>4</answer>"
    color = ActionFields({"$defs": {"Color": {"enum": ["red", "blue"], "type": "string"}},
                          "properties": {"color": {"$ref": "#/$defs/Color"}, "on": {"type": "boolean"}},
                          "required": ["color", "on"]})
    assert color.parse("<answer>blue yes</answer>") == ({"color": "blue", "on": True}, "")
    assert color.parse("<answer>green yes</answer>")[0] is None


async def test_an_invalid_reply_is_a_penalised_no_op_or_ends_the_episode(urls):
    env = OpenEnvEnv(url=urls["ws_app"], sessions=2)  # two episodes at once below
    first, _ = await env.reset(seed=3)
    obs, reward, terminated, _, info = await env.step("<answer>sideways 1</answer>")
    assert (reward, terminated, info["action_valid"]) == (-0.1, False, False)
    assert obs.startswith("Invalid action: direction='sideways' is not one of up, down, left, right")
    obs, reward, *_ = await env.step("<answer>up 1</answer>")  # the server never saw the invalid one
    again = OpenEnvEnv(url=urls["ws_app"], sessions=2)
    await again.reset(seed=3)
    assert (obs, reward) == (await again.step("<answer>up 1</answer>"))[:2]
    env.close()
    again.close()
    ending = OpenEnvEnv(url=urls["ws_app"], invalid="end", format_penalty=-1.0)
    await ending.reset(seed=3)
    _, reward, terminated, _, info = await ending.step("go north")
    assert (reward, terminated, info["success"], info["action_valid"]) == (-1.0, True, False, False)


async def test_render_and_parse_overrides(urls):
    env = OpenEnvEnv(url=urls["ws_app"], render=f"{APPS}:render_goal_first", parse=f"{APPS}:parse_letters",
                     instructions="Reply U1, D2, L1, R2 and the like.")
    obs, _ = await env.reset(seed=3)
    assert obs == "goal 0,2 you 1,0" and env.instructions.endswith("Reply U1, D2, L1, R2 and the like.")
    obs, reward, _, _, info = await env.step("U1")
    assert (obs, reward, info["action"]) == ("goal 0,2 you 0,0", -0.1, {"direction": "up", "steps": 1})
    assert (await env.step("<answer>up 1</answer>"))[4]["action_valid"] is False
    env.close()
    with pytest.raises(ConfigError, match=r"env.args.parse='openenv_apps:nope': module 'openenv_apps' has no 'nope'"):
        OpenEnvEnv(url=urls["ws_app"], parse="openenv_apps:nope")


async def test_a_server_error_fails_the_episode_in_one_line(urls):
    env = OpenEnvEnv(url=urls["ws_app"])
    await env.reset(seed=openenv_apps.FAIL_SEED)
    with pytest.raises(EnvError, match="step failed on the server at .*the walk broke down") as e:
        await env.step("<answer>up 1</answer>")
    assert "\n" not in str(e.value)
    env.close()


async def test_a_server_that_does_not_answer_in_time_is_one_line(urls):
    env = OpenEnvEnv(url=urls["ws_app"], timeout=0.5)
    await env.reset(seed=openenv_apps.HANG_SEED)
    with pytest.raises(EnvError, match=r"did not answer step within 0.5 s \(env.args.timeout\)") as e:
        await env.step("<answer>up 1</answer>")  # the server's step waits for RELEASE, which is never set here
    assert "\n" not in str(e.value)
    env.close()


def test_a_server_that_accepts_but_never_answers_fails_the_plan_in_one_line(tmp_path):
    import socket

    with socket.socket() as silent:  # listens (the connection is made) and never reads or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(ConfigError, match=r"did not answer GET /schema within 0.3 s \(env.args.timeout\)"):
            OpenEnvEnv(url=url, timeout=0.3)


@pytest.mark.parametrize("command", ["plan", "train"])
def test_an_unreachable_url_or_a_module_that_does_not_load_is_one_line(command, tmp_path, capsys):
    with socket_closed() as url:
        for args, said in [([f"env.args.url={url}"], f"openenv: url='{url}': no server answers (ConnectError"),
                           (["env.args.app=no_such_module:app"], "cannot import 'no_such_module': ModuleNotFound"),
                           ([f"env.args.url={url}", "env.args.invalid=skip"], "invalid='skip' is invalid")]:
            code = cli_main([command, "env.type=openenv", *args, f"run_dir={tmp_path / 'run'}"])
            err = capsys.readouterr().err.strip()
            assert code != 0 and said in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


class socket_closed:
    """A loopback URL nothing listens on (a port bound, then released)."""

    def __enter__(self) -> str:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return f"http://127.0.0.1:{s.getsockname()[1]}"

    def __exit__(self, *exc) -> None:
        pass


def test_bad_arguments_are_one_line(urls):
    for kwargs, said in [({}, "url=None is invalid"), ({"url": "ftp://x"}, "http:// or https://"),
                         ({"url": urls["ws_app"], "app": "a:b"}, "one of the two"),
                         ({"url": urls["ws_app"], "transport": "udp"}, "transport='udp' is invalid"),
                         ({"url": urls["ws_app"], "timeout": 0}, "timeout=0 is invalid"),
                         ({"url": urls["ws_app"], "sessions": 0}, "sessions=0 is invalid"),
                         ({"app": "openenv_apps"}, "must be 'module:attr'")]:
        with pytest.raises(ConfigError, match=said) as e:
            OpenEnvEnv(**kwargs)
        assert "\n" not in str(e.value)


def test_an_app_is_served_on_loopback_and_stopped(urls):
    env = OpenEnvEnv(app=f"{APPS}:http_app")  # served once per process: the module's server, reused
    assert env.url == urls["http_app"] == served_urls()[f"{APPS}:http_app"]
    own = f"{Path(APPS).with_suffix('')}:ws_app"  # the same app under another name: a server of its own
    url = serve_app(own, 30.0)
    assert url.startswith("http://127.0.0.1:") and url not in urls.values()
    assert httpx.get(f"{url}/health", trust_env=False).json() == {"status": "healthy"}
    stop_apps(own)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", trust_env=False)


def test_the_reference_is_a_random_policy_on_the_evaluated_seeds(urls):
    class Played:
        def __init__(self, seed):
            self.env_seed = seed

    env = OpenEnvEnv(url=urls["ws_app"], baseline_plays=2, baseline_turns=6)
    got = env.eval_baselines([Played(s) for s in range(8)])
    assert set(got) == {"random"} and 0.0 < got["random"] < 1.0
    again = OpenEnvEnv(url=urls["ws_app"], baseline_plays=2, baseline_turns=6)
    assert again.eval_baselines([Played(s) for s in range(8)]) == got  # seeded plays: the same number


def test_in_a_collection_a_server_error_fails_that_episode_only_counted(urls, tiny_tokenizer):
    from agentrl.agents.chat import ChatAgent
    from agentrl.llm.engine import SamplingParams
    from agentrl.rollout.collector import RolloutCollector
    from agentrl.rollout.demos import ScriptedClient
    from agentrl.trajectory import Task

    client = ScriptedClient(tiny_tokenizer, lambda: OpenEnvEnv(url=urls["ws_app"], sessions=4))
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=64), max_turns=4)
    tasks = [Task(env_seed=seed, group_id=g, sampling_seed=g) for g, seed in enumerate([1, openenv_apps.FAIL_SEED, 2])]
    result = RolloutCollector.single(client.env_factory, agent, client).collect(tasks)
    assert (result.failed_episodes, result.failures["env"], result.dropped_groups) == (1, 1, 1)
    assert len(result.errors) == 1 and "the walk broke down" in result.errors[0]
    assert sorted(t.env_seed for t in result.trajectories) == [1, 2]  # the others played on, replies valid
    assert all(t.invalid_actions == 0 and t.num_generated for t in result.trajectories)
