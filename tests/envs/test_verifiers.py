"""verifiers 0.4.0 environments through env.type=verifiers: the worker in .venv-verifiers, a single-turn
taskset and a multi-turn env, rewards equal to verifiers' own scoring, the eval split, bad loads in one line."""

import asyncio
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.envs.checker import check_env
from agentrl.envs.verifiers import EVAL_SEED_BASE, VerifiersEnv, stop_workers, verifiers_python
from agentrl.errors import ConfigError, EnvError
from agentrl.rollout.tasks import EVAL_SEED_BASE as ROLLOUT_EVAL_SEED_BASE

# vf_arith.py (single-turn, loaded as module:function), vf_guess.py (multi-turn, loaded by its taskset id)
ENVS = Path(__file__).parent / "verifiers_envs"
ARITH = {"load": "vf_arith:load_environment", "eval_load": "vf_arith:load_eval"}  # held-out questions for eval
GUESS = {"load": "vf_guess", "eval_load": "vf_guess:load_two_seats"}  # an env of two agents plays eval seeds
PYTHON = verifiers_python()
needs_verifiers = pytest.mark.skipif(not Path(PYTHON).is_file(), reason=f"no verifiers environment at {PYTHON}: "
                                     "run `make verifiers` (or set AGENTRL_VERIFIERS_PYTHON)")

# Scores the same conversations through verifiers itself, in its own environment: each row's task from the
# taskset, a trace of the conversation (assistant messages sampled), `Task.score`, `Trace.reward`.
DIRECT = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
import verifiers.v1 as vf
from verifiers.v1.graph import MessageNode
import vf_arith, vf_guess
sets = {"arith": vf_arith.load_environment(), "guess": vf_guess.load_environment().taskset}
async def one(name, row, messages):
    task = list(sets[name])[row]
    trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data),
                     agent=vf.AgentInfo(config=vf.AgentConfig()))
    kinds = {"user": vf.UserMessage, "system": vf.SystemMessage, "assistant": vf.AssistantMessage}
    for i, m in enumerate(messages):
        msg = kinds[m["role"]](content=m["content"])
        trace.nodes.append(MessageNode(parent=i - 1 if i else None, message=msg, sampled=m["role"] == "assistant"))
    await task.score(trace)
    return trace.reward
print(json.dumps([asyncio.run(one(*case)) for case in json.loads(sys.stdin.read())]))
"""


@pytest.fixture(scope="module")
def direct():
    """verifiers' own scoring in a process of its own, started at once: its imports overlap the workers'."""
    proc = subprocess.Popen([PYTHON, "-c", DIRECT, str(ENVS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def verifiers_own(direct: subprocess.Popen, cases: list) -> list[float]:
    """The rewards verifiers itself gives `cases` ([taskset, row, messages])."""
    out, _ = direct.communicate(json.dumps(cases), timeout=300)
    assert direct.returncode == 0
    return json.loads(out)


@pytest.fixture(scope="module")
def envs(direct):
    """An arith and a guess env (a worker each, shared by the module, started side by side)."""
    with ThreadPoolExecutor(2) as pool:
        arith = pool.submit(VerifiersEnv, **ARITH, paths=[str(ENVS)])
        guess = pool.submit(VerifiersEnv, **GUESS, paths=[str(ENVS)])
        yield arith.result(), guess.result()
    stop_workers()


async def _play(env: VerifiersEnv, seed: int, replies: list[str]) -> tuple[list[dict], list[tuple]]:
    """The conversation as verifiers sees it (system, user turns, replies) and every step's result."""
    obs, _ = await env.reset(seed)
    messages = [{"role": "system", "content": env.instructions}, {"role": "user", "content": obs}]
    steps = []
    for reply in replies:
        step = await env.step(reply)
        steps.append(step)
        messages.append({"role": "assistant", "content": reply})
        if step[2]:
            break
        messages.append({"role": "user", "content": step[0]})
    return messages, steps


@needs_verifiers
def test_verifiers_envs_pass_check_env(envs):
    for args in (ARITH, GUESS):  # the fixture's workers; check_env plays training seeds
        assert check_env(lambda args=args: VerifiersEnv(**args, paths=[str(ENVS)]))["episodes"] == 9


@needs_verifiers
def test_an_env_that_runs_a_second_agent_fails_its_episode_in_one_line(envs):
    env = envs[1]
    asyncio.run(env.reset(EVAL_SEED_BASE))
    with pytest.raises(EnvError, match="the env runs a second agent 'critic' besides 'player'") as e:
        asyncio.run(env.step("2"))
    assert "\n" not in str(e.value)
    assert asyncio.run(env.reset(1))[0].startswith("Guess my number")  # the next episode plays
    env.close()


def test_the_eval_seed_base_is_the_rollouts():
    assert EVAL_SEED_BASE == ROLLOUT_EVAL_SEED_BASE


@needs_verifiers
def test_rewards_are_verifiers_own_for_the_same_replies(envs, direct):
    arith, guess = envs
    games = [(arith, "arith", 3, ["3"]), (arith, "arith", 3, ["10"]), (arith, "arith", 5, ["forty"]),
             (guess, "guess", 2, ["1", "3"]), (guess, "guess", 0, ["3", "2", "1"]),
             (guess, "guess", 1, ["4", "4", "4"]), (guess, "guess", 3, ["4"])]
    played = [asyncio.run(_play(env, seed, replies)) for env, _, seed, replies in games]
    ours = [steps[-1][1] for _, steps in played]
    assert all(steps[-1][2] and not steps[-1][3] for _, steps in played)  # every game ended by the env: terminated
    assert ours == verifiers_own(direct, [[name, seed, msgs] for (_, name, seed, _), (msgs, _) in zip(games, played)])
    # what they are: exact + 0.5 * short; solved + 0.25 * early
    assert ours == [1.5, 0.5, 0.0, 1.0 + 0.25 * 2 / 3, 1.0 + 0.25 / 3, 0.0, 1.25]


@needs_verifiers
def test_single_turn_shows_the_prompt_and_ends_with_the_rubric(envs):
    arith, _ = envs
    obs, info = asyncio.run(arith.reset(3))
    assert (obs, info, arith.instructions) == ("What is 1 + 2?", {"split": "train", "row": 3},
                                               "Answer with the number only.")
    obs, reward, terminated, truncated, info = asyncio.run(arith.step("3"))
    assert (obs, reward, terminated, truncated, info["success"]) == ("", 1.5, True, False, True)
    assert info["metrics"] == {"reply_chars": 1.0, "reward_exact": 1.0, "reward_short": 1.0}
    with pytest.raises(EnvError, match="finished episode"):
        asyncio.run(arith.step("3"))


@needs_verifiers
def test_multi_turn_gives_the_envs_own_turns(envs):
    _, guess = envs
    _, steps = asyncio.run(_play(guess, 0, ["3", "2", "1"]))  # the secret of row 0 is 1
    assert [s[0] for s in steps] == ["No: lower.", "No: lower.", ""]
    assert [s[1] for s in steps[:2]] == [0.0, 0.0] and [s[2] for s in steps] == [False, False, True]


@needs_verifiers
def test_a_stop_predicate_ends_the_exchange(envs):
    _, guess = envs
    _, steps = asyncio.run(_play(guess, 0, ["2", "I give up"]))
    assert [s[2] for s in steps] == [False, True] and steps[1][1] == 0.0 and steps[1][4]["stop"] == "gave_up"


@needs_verifiers
def test_eval_seeds_draw_from_the_eval_split(envs):
    arith, _ = envs
    assert arith.rows == {"train": 16, "eval": 4}
    obs, info = asyncio.run(arith.reset(EVAL_SEED_BASE + 1))
    assert (obs, info) == ("What is 7 + 5?", {"split": "eval", "row": 1})  # vf_arith.load_eval's second row
    arith.close()  # a truncated episode is dropped in the worker
    assert asyncio.run(arith.reset(EVAL_SEED_BASE + 4))[1] == {"split": "eval", "row": 0}
    arith.close()


@needs_verifiers
def test_sample_action_is_one_of_the_answers(envs):
    import random

    arith, _ = envs
    assert arith.sample_action(random.Random(0)) in {str(a + b) for a in range(10) for b in range(10)}


@needs_verifiers
def test_a_bad_load_is_one_line_from_plan(capsys):
    assert main(["plan", "env.type=verifiers", "env.args.load=no_such_module:load"]) != 0
    err = capsys.readouterr().err.strip()
    assert err == ("agentrl: error: env.args: verifiers: cannot import 'no_such_module': "
                   "ModuleNotFoundError: No module named 'no_such_module'")
    with pytest.raises(ConfigError, match="verifiers: 'json' has no function 'nothing'") as e:
        VerifiersEnv(load="json:nothing")
    assert "\n" not in str(e.value)


def test_bad_arguments_are_one_line():
    with pytest.raises(ConfigError, match=r"verifiers: load='a:b:c' is invalid; load must be 'module:function'"):
        VerifiersEnv(load="a:b:c")
    with pytest.raises(ConfigError, match=r"verifiers: load='' is invalid"):
        VerifiersEnv()
    with pytest.raises(ConfigError, match="max_rows"):
        VerifiersEnv(load="m:f", max_rows=0)
    with pytest.raises(ConfigError, match=r"no python at .*make verifiers"):
        VerifiersEnv(load="m:f", python="no/such/python")


@needs_verifiers
def test_a_worker_that_dies_fails_the_episode_in_one_line(envs):
    env = envs[1]  # last in this module: no test after this one uses the guess worker
    asyncio.run(env.reset(0))
    env.worker.process.kill()
    with pytest.raises(EnvError, match=r"verifiers: the worker \(.*python\) exited: ") as e:
        asyncio.run(env.step("2"))
    assert "\n" not in str(e.value)
