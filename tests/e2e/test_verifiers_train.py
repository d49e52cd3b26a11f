"""End-to-end: verifiers environments (a single-turn taskset and a multi-turn env, each scored by its own
rewards) train the embedded model 3 steps in one run, on the engine's own ids, with verifiers' rewards."""

import json
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.dumps import list_dumps, read_dump
from agentrl.envs.verifiers import stop_workers, verifiers_python
from agentrl.metrics import read_jsonl
from agentrl.runtime.local import train

ENVS = Path(__file__).parents[1] / "envs" / "verifiers_envs"
if not Path(verifiers_python()).is_file():
    pytest.skip(f"no verifiers environment at {verifiers_python()}: run `make verifiers` "
                "(or set AGENTRL_VERIFIERS_PYTHON)", allow_module_level=True)

TINY = [  # tests/e2e/test_suites_train.py's tiny sizes, with 3 steps and the trajectories dumped
    "model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=300", "model.warm_start.max_steps=2", "model.warm_start.batch_size=4",
    "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
    "trainer.total_steps=3", "trainer.test_freq=3", "trainer.eval_episodes=4", "trainer.save_freq=0",
    "trainer.progress=false", "trainer.logger=[jsonl]", "trainer.dump_trajectories_freq=1",
]
CONFIG = {  # one tag of each kind: sums of two digits (one turn), guess a number from 1 to 4 (up to 3 turns)
    "exp_name": "verifiers",
    "custom_envs": {
        "arith": {"type": "verifiers", "max_turns": 1,
                  "args": {"load": "vf_arith:load_environment", "eval_load": "vf_arith:load_eval",
                           "paths": [str(ENVS)]}},
        "guess": {"type": "verifiers", "max_turns": 3,
                  "args": {"load": "vf_guess", "paths": [str(ENVS)]}},  # its taskset id
    },
    "train_env_manager": {"tags": ["arith", "guess"], "n_groups": [1, 1]},
    "val_env_manager": {"tags": ["arith", "guess"], "n_groups": [2, 2]},
    "rollout": {"max_new_tokens": 4},
    "algorithm": {"adv_estimator": "grpo"},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The one 3-step run of this module: its folder."""
    tmp = tmp_path_factory.mktemp("verifiers")
    (tmp / "verifiers.yaml").write_text(json.dumps(CONFIG))  # JSON is YAML
    overrides = [*TINY, f"run_dir={tmp / 'run'}", f"model.cache_dir={tmp / 'cache'}"]
    cfg = load_config(str(tmp / "verifiers.yaml"), overrides)
    try:
        train(cfg, log=lambda m: None)
    finally:
        stop_workers()
    return tmp / "run"


def test_both_envs_train_three_steps_and_evaluate(run):
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3]
    assert [r["step"] for r in rows if "eval/arith/success" in r] == [0, 3]
    assert [r["step"] for r in rows if "eval/guess/success" in r] == [0, 3]


def test_the_trained_ids_are_the_engines_and_the_rewards_verifiers(run):
    dumps = [read_dump(path) for _, path in list_dumps(run)]
    assert len(dumps) == 3
    episodes = [ep for dump in dumps for ep in dump["episodes"]]
    assert {ep["tag"] for ep in episodes} == {"arith", "guess"}
    for ep in episodes:
        generated = [k for k, m in enumerate(ep["mask"]) if int(m)]
        # the replies are the engine's samples: the trainer scores each id as the engine did
        assert len(ep["lp"]) == len(ep["old"]) == len(generated) > 0
        assert all(abs(a - b) < 1e-3 for a, b in zip(ep["lp"], ep["old"]))
        # the reward is the rubric's, paid at the end: exact + 0.5 * short; solved + 0.25 * early (k of 3 left)
        possible = {0.0, 0.5, 1.0, 1.5} if ep["tag"] == "arith" else {0.0} | {1.0 + 0.25 * k / 3 for k in (1, 2, 3)}
        assert min(abs(ep["reward"] - r) for r in possible) < 1e-6
        assert ep["rewards"][:-1] == [0.0] * (len(ep["rewards"]) - 1)
