"""Issue 14 item 4: the Python API at the package top (load_config, fit, AgentTrainer)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import agentrl
from agentrl import AgentTrainer, Config, ConfigError, load_config
from agentrl.registry import ENVS

ROOT = Path(__file__).parents[1]
TINY = [  # tests/e2e/test_train.py's TINY without the FrozenLake env arguments
    "model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=300", "model.warm_start.max_steps=4", "model.warm_start.batch_size=4",
    "rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
    "trainer.total_steps=2", "trainer.test_freq=1", "trainer.eval_episodes=2", "trainer.save_freq=0",
    "trainer.progress=false", "trainer.logger=[jsonl]",
]


def _example():
    spec = importlib.util.spec_from_file_location("python_api_example", ROOT / "examples" / "python_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cache_dir(run_model_cache):
    return run_model_cache  # the test run's: a warm start other modules share


def test_import_agentrl_is_light():
    code = "import sys, agentrl; assert 'torch' not in sys.modules and 'transformers' not in sys.modules; print('ok')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT).stdout == "ok\n"


def test_load_config_from_a_file_a_dict_a_config_and_overrides(tmp_path):
    from_file = load_config(ROOT / "configs" / "frozen_lake.yaml", ["trainer.total_steps=3"])
    assert isinstance(from_file, Config) and from_file.trainer.total_steps == 3
    from_dict = load_config({"env": {"type": "sokoban", "max_turns": 4}}, {"rollout.temperature": 0.5, "seed": 7})
    assert (from_dict.env.type, from_dict.env.max_turns, from_dict.rollout.temperature, from_dict.seed) == (
        "sokoban", 4, 0.5, 7)
    again = load_config(from_dict, ["seed=8"])
    assert again.seed == 8 and again.env.type == "sokoban" and from_dict.seed == 7  # the original is untouched
    assert load_config().exp_name == Config().exp_name
    with pytest.raises(ConfigError, match="trainer.total_step"):
        load_config({"trainer": {"total_step": 3}})
    with pytest.raises(ConfigError, match="expected a YAML path, a dict or a Config"):
        load_config(42)


def test_the_readme_example_trains_with_an_env_class_passed_directly(tmp_path, cache_dir):
    """examples/python_api.py, the README's example, with the tiny budget."""
    example = _example()
    summary = example.main([*TINY, f"run_dir={tmp_path / 'a'}", f"model.cache_dir={cache_dir}"])
    assert "eval_success_after" in summary
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["eval_success_after"] == summary[
        "eval_success_after"]
    assert any(n.startswith("ParityEnv") and ENVS.get(n) is example.ParityEnv for n in ENVS.names())  # its name
    # seed 003's way, with verl's arguments it does not need
    notes = []
    trainer = AgentTrainer(config=load_config({"env": {"max_turns": 1}}, [*TINY, f"run_dir={tmp_path / 'b'}",
                                                                           f"model.cache_dir={cache_dir}"]),
                           tokenizer=None, env_cls=example.ParityEnv, role_worker_mapping={},
                           resource_pool_manager=None, reward_fn=None, log=notes.append)
    assert notes[0].startswith("AgentTrainer: ignoring role_worker_mapping, resource_pool_manager, reward_fn")
    trainer.init_workers()
    assert trainer.trainer is not None and (tmp_path / "b" / "config.yaml").is_file()
    summary_b = trainer.fit()
    assert "eval_success_after" in summary_b and trainer.config.env.type == "ParityEnv"


def test_the_readme_block_runs_as_written(tmp_path, cache_dir, monkeypatch):
    """The README's Python example, run as a user pastes it (only the budget made tiny): both ways
    train into the same run folder, the second with overwrite=True."""
    text = (ROOT / "README.md").read_text()
    start = text.index("```python\nimport random\nfrom agentrl import AgentTrainer")
    block = text[start + len("```python\n"):text.index("```", start + 3)]
    assert '["trainer.total_steps=20"]' in block
    block = block.replace('["trainer.total_steps=20"]', repr([*TINY, f"model.cache_dir={cache_dir}"]))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert "eval_success_after" in scope["summary"]
    assert json.loads((tmp_path / "runs" / "parity" / "summary.json").read_text())["steps"] == 2


def test_train_with_an_agent_class_and_a_given_tokenizer(tmp_path, cache_dir, tiny_tokenizer):
    example = _example()
    from agentrl.agents.chat import ChatAgent

    class MyAgent(ChatAgent):
        pass

    cfg = load_config({"env": {"max_turns": 1}}, [*TINY, f"run_dir={tmp_path}", f"model.cache_dir={cache_dir}"])
    trainer = AgentTrainer(cfg, tiny_tokenizer, MyAgent, example.ParityEnv, log=lambda m: None)
    trainer.init_workers()
    assert trainer.trainer.tokenizer is tiny_tokenizer  # the embedded model is built on the given tokenizer
    assert trainer.trainer.actor.model.get_input_embeddings().num_embeddings == len(tiny_tokenizer)
    assert "eval_success_after" in trainer.fit()
    saved = (tmp_path / "config.yaml").read_text()
    assert "type: MyAgent" in saved and "type: ParityEnv" in saved


def test_bad_api_arguments_are_one_line_errors():
    with pytest.raises(ConfigError, match="AgentTrainer: unknown argument 'agent_class'; accepted: config"):
        AgentTrainer(config={}, agent_class=object)
    with pytest.raises(ConfigError, match="env_cls= sets the env section, but custom_envs is set"):
        AgentTrainer(config=load_config(ROOT / "configs" / "mixed.yaml"), env_cls=_example().ParityEnv)
    with pytest.raises(ConfigError, match="agent_cls= must be a class"):
        agentrl.fit({}, agent_cls="chat")
