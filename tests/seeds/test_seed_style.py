"""Issue 14 item 3: an agent and env written as seeds 000/001 show them run unchanged.

The user's module is tests/seeds/areal_math_agent.py; it is run through the real CLI on the
embedded default, as `agentrl train imports=[...] env.type=... agent.type=...`.
"""

import asyncio
import copy
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import no_new_child_processes

from agentrl.agents.compat import SeedAgentAdapter, is_seed_agent
from agentrl.envs.math_grader import shutdown_grader
from agentrl.errors import ConfigError
from agentrl.llm.engine import Completion, SamplingParams
from agentrl.metrics import read_jsonl
from agentrl.runtime.assembly.envs import import_user_modules
from agentrl.trajectory import Task

ROOT = Path(__file__).parents[2]
MODULE = str(Path(__file__).with_name("areal_math_agent.py"))
TINY = [  # tests/e2e/test_train.py's TINY without the FrozenLake env arguments
    "model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=300", "model.warm_start.max_steps=4", "model.warm_start.batch_size=4",
    "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
    "trainer.total_steps=2", "trainer.test_freq=1", "trainer.eval_episodes=2", "trainer.save_freq=0",
    "trainer.progress=false", "trainer.logger=[jsonl]", "rollout.max_new_tokens=8",
]
ROWS = [{"query_id": f"q{i}", "prompt": f"What is {a} + {b}?", "solutions": [f"\\boxed{{{a + b}}}"], "task": "math"}
        for i, (a, b) in enumerate([(1, 2), (3, 4), (2, 2), (5, 1), (0, 3), (4, 4)])]


def _agentrl(*args):
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)


@pytest.fixture(scope="module", autouse=True)
def _stop_grader():
    # The seeds' math_verify_call grades in a worker process: no test after these may inherit it.
    with no_new_child_processes(shutdown_grader, "grader processes"):
        yield


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


@pytest.fixture(scope="module")
def seed_module():
    import_user_modules([MODULE])
    return sys.modules["areal_math_agent"]


def test_seed_agent_and_env_train_unchanged_through_the_cli(tmp_path, dataset, seed_module):
    """reset/step-only env (no close, no sample_action), reset() -> (None, {}) with the question
    from the dataset, an Agent subclass loading AutoTokenizer from tokenizer_path, and its
    returned samples' rewards (its own shaping) are what is trained on."""
    env_cls = seed_module.MathCodeSingleStepEnv
    assert not hasattr(env_cls, "close") and not hasattr(env_cls, "sample_action")  # AReaL's base, not ours
    run = tmp_path / "run"
    res = _agentrl("train", f"imports=[{MODULE}]", "env.type=seed-math-code-single-step",
                   f"env.args.dataset_path={dataset}", "env.max_turns=2", "agent.type=seed-math-multi-turn",
                   "agent.args.num_turns=2", *TINY, f"run_dir={run}", f"model.cache_dir={tmp_path / 'cache'}")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "warning" not in res.stderr
    assert "replies are random answers of its dataset" in res.stdout + res.stderr  # the warm start's fallback
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    samples = read_jsonl(run / "samples.jsonl")
    questions = {r["prompt"] for r in ROWS}
    assert samples and all(any(q in s["text"] for q in questions) for s in samples)  # dataset rows as prompts
    # the agent's shaping: a failed episode is -0.25 per try (the env's own rewards would give 0)
    assert all(s["reward"] in (-0.25, -0.5) for s in samples if not s["success"])
    assert all(s["reward"] in (1.0, 0.25) for s in samples if s["success"])


def test_a_seed_env_without_a_dataset_fails_in_one_line_naming_the_setting(tmp_path, capsys):
    """(The CLI's entry point in this process, as tests/e2e/test_env_groups.py runs start-up errors;
    an exception escaping it would fail the test itself.)"""
    from agentrl.cli import main

    code = main(["train", f"imports=[{MODULE}]", "env.type=seed-no-dataset", "env.max_turns=2",
                 "agent.type=seed-math-multi-turn", *TINY, "rollout.max_retries=0", f"run_dir={tmp_path / 'run'}",
                 f"model.cache_dir={tmp_path / 'cache'}"])
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("agentrl: error:") and "Traceback" not in err
    assert "reset() gave no question" in last and "env.args.dataset_path" in last
    assert "pack()" not in err


def test_an_agent_subclassing_a_seed_base_is_seed_style(seed_module):
    import agentrl
    from agentrl.agents.base import Agent as OurContract

    assert is_seed_agent(seed_module.MathMultiTurnAgent)  # subclasses agentrl.Agent

    class OnOurProtocol(OurContract):  # `class MathMultiTurnAgent(Agent)` with our contract's Agent imported
        async def collect_trajectory(self, prompt, env, obs_queue, act_queue):
            pass

    class Ours:
        async def run_episode(self, task, env, llm):
            pass

    class Both(agentrl.Agent):
        async def run_episode(self, task, env, llm):
            pass

    assert is_seed_agent(OnOurProtocol) and is_seed_agent(Both)
    assert not is_seed_agent(Ours)


def test_the_seeds_names_exist_where_a_user_looks():
    import agentrl
    from agentrl import agents, envs
    from agentrl.registry import ENVS

    for name in ("Agent", "EnvironmentService", "BundledGenerationOutputs", "GenerationHyperparameters",
                 "SequenceSample", "math_verify_call", "register_environment", "register_agent", "register_env"):
        assert getattr(agentrl, name) is not None, name
    assert agents.Agent is agentrl.Agent and agents.SequenceSample is agentrl.SequenceSample
    assert envs.EnvironmentService is agentrl.EnvironmentService and envs.math_verify_call is agentrl.math_verify_call
    gconfig = agentrl.GenerationHyperparameters(max_new_tokens=8).new(n=1)
    assert gconfig.n == 1 and gconfig.max_new_tokens == 8

    class MyEnv(agentrl.EnvironmentService):
        async def step(self, action):
            return None, [1.0], True, False, {}

    agentrl.register_environment("seed-names-test-env", MyEnv)
    assert ENVS.get("seed-names-test-env") is MyEnv
    assert asyncio.run(MyEnv().reset()) == (None, {})
    MyEnv().close()  # optional, and harmless


def test_math_verify_call_is_thread_safe():
    from agentrl import math_verify_call

    id2info = {f"q{n}": {"solutions": [f"\\boxed{{{n}}}"]} for n in range(8)}
    id2info["half"] = {"answer": "1/2"}
    jobs = [([f"The answer is \\boxed{{{n}}}", f"\\boxed{{{n + 1}}}"], [f"q{n}@0", f"q{n}@1"]) for n in range(8)]
    jobs.append((["0.5", "\\frac{1}{2}", "2"], ["half"] * 3))
    expected = [[1.0, 0.0]] * 8 + [[1.0, 1.0, 0.0]]
    results = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def work(k):
        start.wait()  # every thread calls at once
        results[k] = math_verify_call(id2info, *jobs[k])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected

    async def seeds_way():  # as seed 001 calls it, from many episodes at once
        return await asyncio.gather(*(asyncio.to_thread(math_verify_call, id2info, *job) for job in jobs))

    assert asyncio.run(seeds_way()) == expected
    assert asyncio.run(asyncio.wait_for(_direct(id2info), 60)) == [1.0]  # called without to_thread: still works
    with pytest.raises(Exception, match="query id 'nope' is not in id2info"):
        math_verify_call(id2info, ["1"], ["nope"])


async def _direct(id2info):
    from agentrl import math_verify_call

    return math_verify_call(id2info, ["3"], ["q3"])


class _Replies:
    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies = tokenizer, list(replies)

    async def generate(self, prompt_ids, sampling):
        ids = self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return Completion(ids, [-1.0] * len(ids), "stop")


class _QuestionEnv:
    async def reset(self, seed=None, options=None):
        return f"Question {seed}", {}

    async def step(self, action):
        _, answers = action
        return None, [float("yes" in a) for a in answers], True, False, {}


def _returning(value):
    class Returner:
        def __init__(self, gconfig, tokenizer):
            self.gconfig, self.tokenizer = gconfig, tokenizer

        async def collect_trajectory(self, prompt, env, obs_queue, act_queue):
            ids = list(prompt.data["packed_prompts"])
            for _ in range(2):
                await obs_queue.put((prompt.ids[0], ids, self.gconfig))
                act = await act_queue.get()
                await env.step((prompt.ids[0], [self.tokenizer.decode(act.output_ids[0])]))
                ids = list(act.seqs[0]) + self.tokenizer.encode("\nagain\n", add_special_tokens=False)
            return value

    return Returner


def _episode(agent_cls, tokenizer):
    adapter = SeedAgentAdapter.from_class(agent_cls, tokenizer, SamplingParams(max_new_tokens=4), max_turns=2)
    return asyncio.run(adapter.run_episode(Task(env_seed=1, group_id=0, sampling_seed=0), _QuestionEnv(),
                                           _Replies(tokenizer, ["no", "yes"])))


def test_returned_samples_carry_the_agents_reward_shaping(tiny_tokenizer, capfd):
    from agentrl import SequenceSample

    samples = [SequenceSample.from_default(ids=["1"], data={"rewards": [-0.3]}), {"rewards": 0.7}]
    assert _episode(_returning(samples), tiny_tokenizer).rewards == [-0.3, 0.7]
    assert _episode(_returning(None), tiny_tokenizer).rewards == [0.0, 1.0]  # the env steps' rewards
    assert "warning" not in capfd.readouterr().err


def test_a_return_value_that_cannot_be_used_is_named_in_one_warning(tiny_tokenizer, capfd):
    traj = _episode(_returning([{"rewards": [0.5]}]), tiny_tokenizer)  # one sample for two turns
    assert traj.rewards == [0.0, 1.0]
    _episode(_returning([{"rewards": [0.5]}]), tiny_tokenizer)
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("agentrl: warning: Returner.collect_trajectory returned 1 samples "
                                               "for 2 turns")
    _episode(_returning("done"), tiny_tokenizer)
    assert "returned a str, which is dropped" in capfd.readouterr().err


def test_a_seed_agent_whose_constructor_fails_is_one_config_error(tiny_tokenizer, seed_module):
    in_memory = copy.deepcopy(tiny_tokenizer)
    in_memory.name_or_path = ""  # a tokenizer with no folder: the agent's from_pretrained("") fails
    with pytest.raises(ConfigError, match=r"^agent: building MathMultiTurnAgent\(gconfig, tokenizer_path, num_turns\) raised OSError"):
        SeedAgentAdapter.from_class(seed_module.MathMultiTurnAgent, in_memory, SamplingParams(), max_turns=2)


def test_the_embedded_default_gives_seed_agents_a_tokenizer_folder(tmp_path, dataset, seed_module):
    from transformers import AutoTokenizer

    from agentrl.config import load_config
    from agentrl.runtime.assembly.policy import load_policy
    from agentrl.runtime.assembly.plan import plan

    cfg = load_config(None, [f"imports=[{MODULE}]", "env.type=seed-math-code-single-step",
                             f"env.args.dataset_path={dataset}", "agent.type=seed-math-multi-turn", *TINY,
                             "model.warm_start.max_steps=1", f"model.cache_dir={tmp_path}"])
    for _ in range(2):  # built, then from the cache
        _, tokenizer = load_policy(plan(cfg), log=lambda m: None)
        folder = Path(tokenizer.name_or_path)
        assert folder.is_dir() and not (folder / "config.json").exists()
        text = "What is 12 + 345? \\boxed{357}"
        assert AutoTokenizer.from_pretrained(folder).encode(text) == tokenizer.encode(text)


def test_a_malformed_queue_request_is_one_line_naming_the_shape(tiny_tokenizer):
    from agentrl.errors import EnvError

    class TwoTuple:
        async def collect_trajectory(self, prompt, env, obs_queue, act_queue):
            await obs_queue.put((prompt.ids[0], list(prompt.data["packed_prompts"])))  # gconfig forgotten
            await act_queue.get()

    adapter = SeedAgentAdapter.from_class(TwoTuple, tiny_tokenizer, SamplingParams(max_new_tokens=4), max_turns=2)
    with pytest.raises(EnvError, match=r"on obs_queue; expected a \(qid, token_ids: list of ints, gconfig\) tuple"):
        asyncio.run(adapter.run_episode(Task(env_seed=1, group_id=0, sampling_seed=0), _QuestionEnv(),
                                        _Replies(tiny_tokenizer, ["yes"])))


class _GuessEnv:
    """Our own contract's env with reset and step only: no close, no sample_action, no instructions."""

    async def reset(self, seed=None, options=None):
        return "Say yes.", {}

    async def step(self, action):
        ok = "yes" in action
        return "Done.", float(ok), True, False, {"success": ok}


def test_an_env_with_reset_and_step_only_trains_with_our_own_agent(tmp_path):
    import agentrl

    logs = []
    cfg = agentrl.load_config({"env": {"max_turns": 1}}, [*TINY, f"run_dir={tmp_path / 'run'}",
                                                          f"model.cache_dir={tmp_path / 'cache'}"])
    summary = agentrl.fit(cfg, env_cls=_GuessEnv, log=logs.append)
    assert "eval_success_after" in summary
    assert any("is not demonstrated (its env has no sample_action" in m for m in logs)
    assert any(m.startswith("warm start skipped") for m in logs)


# A user's module: a seed-style agent that loads its tokenizer from `tokenizer_path`, as seed 001's
# does, and notes what it was given; and an env it plays (reset/step with (qid, answers)).
PATH_AGENT = '''
import json, os
from transformers import AutoTokenizer
from agentrl import register_agent, register_env

@register_agent("path-noting-agent")
class PathNotingAgent:
    def __init__(self, gconfig, tokenizer_path, tries=1):
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        if tries < 1:
            raise ValueError(f"tries must be at least 1, got {tries}")
        if "NOTED_PATHS" in os.environ:
            with open(os.environ["NOTED_PATHS"], "a") as f:
                f.write(json.dumps({"path": tokenizer_path, "vocab": len(self.tokenizer)}) + "\\n")
        self.gconfig = gconfig.new(n=1)

    async def collect_trajectory(self, prompt, env, obs_queue, act_queue):
        await obs_queue.put((prompt.ids[0], list(prompt.data["packed_prompts"]), self.gconfig))
        act = await act_queue.get()
        await env.step((prompt.ids[0], [self.tokenizer.decode(act.output_ids[0], skip_special_tokens=True)]))

@register_env("say-yes")
class SayYes:
    async def reset(self, seed=None, options=None):
        return f"Question {seed}: say yes.", {}

    async def step(self, action):
        _, answers = action
        return None, [float("yes" in a) for a in answers], True, False, {}

    def sample_action(self, rng):
        return "yes"
'''
# Any connection or name lookup beyond this machine is noted and refused, in the process run.
NO_NETWORK = '''
import os, socket, sys
LOCAL = {"localhost", socket.gethostname(), socket.getfqdn()}

def _refuse(what):
    with open(os.environ["NETWORK_ATTEMPTS"], "a") as f:
        f.write(what + "\\n")
    raise OSError(f"no network in this test: {what}")

def _local(host):
    host = host.decode() if isinstance(host, bytes) else str(host)
    return host in LOCAL or host.startswith(("127.", "::1", "0.0.0.0")) or host in ("", "None")

_getaddrinfo, _connect, _connect_ex = socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex

def getaddrinfo(host, *args, **kwargs):
    if host is not None and not _local(host):
        _refuse(f"getaddrinfo {host}")
    return _getaddrinfo(host, *args, **kwargs)

def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
        _refuse(f"connect {address}")
    return _connect(self, address)

def connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
        _refuse(f"connect {address}")
    return _connect_ex(self, address)

socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex = getaddrinfo, connect, connect_ex
'''
RUN = {
    "cli": "from agentrl.cli import main\nsys.exit(main(sys.argv[1:]))\n",
    # the user's script imported transformers (and the Hub's settings) before agentrl
    "api": "import transformers\nimport agentrl\nagentrl.fit(overrides=sys.argv[2:])\n",
}


@pytest.mark.parametrize("entry", sorted(RUN))
def test_a_seed_agent_loading_its_tokenizer_trains_without_reaching_for_the_network(tmp_path, entry):
    """The agent's `AutoTokenizer.from_pretrained(tokenizer_path)` gets a folder that loads, in the
    start-up check and in the run, and nothing in the run tries to reach the Hugging Face Hub."""
    module = tmp_path / "path_agent.py"
    module.write_text(PATH_AGENT)
    noted, attempts = tmp_path / "noted.jsonl", tmp_path / "network.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(PYTHONPATH=str(ROOT), NOTED_PATHS=str(noted), NETWORK_ATTEMPTS=str(attempts))
    res = subprocess.run([sys.executable, "-c", NO_NETWORK + RUN[entry], "train", f"imports=[{module}]",
                          "env.type=say-yes", "env.max_turns=1", "agent.type=path-noting-agent", *TINY,
                          f"run_dir={tmp_path / 'run'}", f"model.cache_dir={tmp_path / 'cache'}"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not attempts.exists(), attempts.read_text()
    paths = read_jsonl(noted)
    assert len(paths) >= 2 and all(p["vocab"] > 0 for p in paths)  # the start-up check's, then the run's
    from transformers import AutoTokenizer

    run_folder = Path(paths[-1]["path"])  # the run's tokenizer, in the model cache
    assert run_folder.is_dir() and len(AutoTokenizer.from_pretrained(run_folder)) == paths[-1]["vocab"]


def test_a_seed_agent_loading_its_tokenizer_has_its_arguments_checked_before_any_model(tmp_path, capsys):
    """The start-up check builds the agent on a stand-in tokenizer whose folder loads, so a
    rejected argument is one line before the warm start, not after it (the CLI's entry point in
    this process: the tests above start processes of their own)."""
    from agentrl.cli import main

    module = tmp_path / "path_agent.py"
    module.write_text(PATH_AGENT)
    code = main(["train", f"imports=[{module}]", "env.type=say-yes", "agent.type=path-noting-agent",
                 "agent.args.tries=0", *TINY, f"run_dir={tmp_path / 'run'}", f"model.cache_dir={tmp_path / 'cache'}"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err[-3000:]
    assert "agent.args.tries=0 is rejected by agent type 'path-noting-agent'" in lines[0]
    assert "tries must be at least 1, got 0" in lines[0]
    assert not (tmp_path / "cache").exists()  # no model was built or warm-started
