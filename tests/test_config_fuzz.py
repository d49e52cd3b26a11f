"""Fuzzing the config: every bad value of every field ends in ONE line naming the field, before
any model is built.

Mutations are generated deterministically from the schema (each field's type says which values
are wrong for it: garbage strings, wrong types, nan/inf/1e400, integers beyond any bound), plus
semantic ones (zero and negative sizes, unknown names, impossible model shapes). Each goes through
the function the CLI calls (`load_config`, then `build_trainer`, whose model-free checks run
first); building the model is replaced by a tripwire, so a check that would only run after the
warm start fails the test.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

import agentrl.runtime.build as building
import agentrl.runtime.warm as warm
from agentrl.config import Config, load_config
from agentrl.config_io import _field_types
from agentrl.errors import AgentRLError

ROOT = Path(__file__).parents[1]
HUGE = str(2**64)  # beyond int64, beyond every seed torch accepts


def _leaf_types(cls: type = Config, prefix: str = "") -> dict[str, Any]:
    """{dotted key: type} of every leaf field."""
    out = {}
    for f in dataclasses.fields(cls):
        tp = _field_types(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            out.update(_leaf_types(tp, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = tp
    return out


def _optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _base(tp: Any) -> Any:
    if _optional(tp):
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
    return tp


def _bad_values(tp: Any) -> list[str]:
    """Override values (YAML text) that no field of type `tp` accepts."""
    base, nullable = _base(tp), _optional(tp)
    origin = typing.get_origin(base)
    null = [] if nullable else ["null"]
    if base is bool:
        return ["maybe", "2", "[true]", "nan", *null]
    if base is int:
        return ["abc", "1.5", "[1]", "{a: 1}", "true", HUGE, "-" + HUGE, "1e400", "nan", *null]
    if base is float:
        return ["abc", "nan", ".nan", ".inf", "-.inf", "1e400", "1.0e+400", "-1e400", "[1]", "{a: 1}", "true", *null]
    if base is str:
        return ["[1]", "{a: 1}", "3", "true", *null]
    if origin is Literal:
        return ["no_such_choice", "3", "[a]", "nan", *null]
    if origin is list:
        (item,) = typing.get_args(base)
        bad_item = {int: "abc", float: "nan", str: "3"}.get(_base(item), "3")
        return ["abc", "3", "{a: 1}", f"[{bad_item}]", *null]
    if origin is dict or base is dict:
        return ["abc", "3", "[1, 2]", *null]
    raise AssertionError(f"no mutations for type {tp!r}")


# Semantic mutations: well-typed values that no run can use.
SEMANTIC = [
    *[(f"{section}.{key}", v) for section, keys in {
        "rollout": ("batch_size", "group_size", "max_new_tokens"),
        "engine": ("max_num_seqs", "max_num_batched_tokens"),
        "actor": ("ppo_epochs", "ppo_mini_batch_size", "micro_batch_size"),
        "trainer": ("total_steps", "eval_episodes", "max_checkpoints"),
        "model.tiny": ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                       "intermediate_size", "vocab_size", "max_position_embeddings"),
        "model.warm_start": ("batch_size", "patience"),
        "env": ("max_turns",)}.items() for key in keys for v in ("0", "-1", "-" + HUGE, str(10**11))],
    ("seed", "-1"), ("seed", HUGE), ("model.tiny.num_attention_heads", "3"), ("model.tiny.num_key_value_heads", "3"),
    ("model.tiny.hidden_size", "12"),  # 4 heads of 3 dims: rotary embeddings need an even head size
    ("model.warm_start.max_steps", "-1"), ("model.warm_start.lr", "-1.0"), ("rollout.batch_size", "30"),
    ("rollout.top_p", "0"), ("rollout.top_p", "1.5"), ("rollout.temperature", "0"), ("rollout.top_k", "-2"),
    ("rollout.max_staleness", "-1"), ("rollout.episode_timeout", "0"), ("rollout.max_retries", "-1"),
    ("rollout.max_failed_fraction", "2"), ("engine.max_total_tokens", "1"), ("rollout.max_model_len", "-1"),
    ("rollout.max_model_len", "100000"), ("rollout.max_new_tokens", "4096"), ("rollout.max_episode_tokens", "-5"),
    ("rollout.rollout_filter_ratio", "0"), ("actor.lr", "-1e-3"), ("actor.betas", "[0.9]"),
    ("actor.betas", "[0.9, 1.5]"), ("actor.clip_ratio_c", "0.5"), ("actor.min_lr_ratio", "2"),
    ("actor.lr_warmup_steps_ratio", "1"), ("actor.loss_scale_factor", "0"), ("actor.behav_imp_weight_cap", "1"),
    ("algorithm.gamma", "1.5"), ("algorithm.lam", "-0.1"), ("algorithm.kl_ctrl.kl_coef", "-1"),
    ("algorithm.kl_ctrl.horizon", "0"), ("algorithm.kl_ctrl.target_kl", "0"), ("trainer.test_freq", "-1"),
    ("trainer.save_freq", "-1"), ("trainer.logger", "[foo]"), ("trainer.logger", "[jsonl, mlflow]"),
    ("env.type", "no_such_env"), ("env.type", "frozen_lak"), ("agent.type", "no_such_agent"),
    ("algorithm.adv_estimator", "no_such_estimator"), ("env.args.map_name", "9x9"), ("env.args.no_such_arg", "1"),
    ("agent.args.no_such_arg", "1"), ("imports", "[no_such_module_xyz]"), ("train_env_manager.tags", "[nowhere]"),
    ("train_env_manager.n_groups", "[0]"), ("train_env_manager.n_groups", "[1, 2]"), ("val_env_manager.tags", "[x]"),
    ("model.path", "/no/such/model/dir"), ("custom_envs", "abc"), ("trainer.on_collapse", "halt"),
    ("trainer.dump_max_tokens", "0"), ("health.patience", "0"), ("health.reply_repeat", "2"),
]


def _cases() -> list[tuple[str, str]]:
    cases = [(key, value) for key, tp in _leaf_types().items() for value in _bad_values(tp)]
    return cases + SEMANTIC


@pytest.fixture
def no_model(monkeypatch):
    """build_trainer with a tripwire where the model would be built or warm-started."""
    def tripwire(*args, **kwargs):
        raise AssertionError("the model was about to be built: this check runs too late")
    monkeypatch.setattr(building, "load_policy", tripwire)
    monkeypatch.setattr(warm, "build_tiny", tripwire)


def _field_in(message: str, key: str) -> bool:
    """The message names the field (a list item 'key[0]' or an env/agent argument counts)."""
    parent, _, leaf = key.rpartition(".")
    return key in message or bool(parent) and parent in message and leaf in message


def _run_checks(key: str, value: str, tmp_path: Path) -> AgentRLError:
    with pytest.raises(AgentRLError) as err:
        cfg = load_config(ROOT / "configs" / "frozen_lake.yaml", [f"{key}={value}", f"run_dir={tmp_path}"])
        building.build_trainer(cfg, tmp_path, log=lambda m: None)
    return err.value


def test_the_fuzz_covers_every_field():
    keys = {k for k, _ in _cases()}
    assert keys >= set(_leaf_types()), set(_leaf_types()) - keys
    assert len(_cases()) > 600


@pytest.mark.parametrize("key, value", _cases())
def test_every_bad_value_is_one_line_naming_the_field_before_the_model(key, value, tmp_path, no_model):
    message = str(_run_checks(key, value, tmp_path))
    assert "\n" not in message, message
    assert _field_in(message, key), f"{key}={value}: {message}"


@pytest.mark.parametrize("text, key", [
    ("actor:\n  lr: .nan\n", "actor.lr"),
    ("rollout:\n  temperature: 1e400\n", "rollout.temperature"),
    ("rollout:\n  batch_size: 18446744073709551616\n", "rollout.batch_size"),
    ("model:\n  tiny:\n    num_attention_heads: 3\n", "model.tiny.num_attention_heads"),
    ("trainer:\n  logger: [console, foo]\n", "trainer.logger"),
    ("agent:\n  type: math_retry\n  args:\n    turn_discount: abc\n", "agent.args.turn_discount"),
])
def test_bad_values_in_a_yaml_file_too(text, key, tmp_path, no_model):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(AgentRLError) as err:
        building.build_trainer(load_config(path, [f"run_dir={tmp_path}"]), tmp_path, log=lambda m: None)
    assert key in str(err.value) and "\n" not in str(err.value)


class Reached(Exception):
    """Raised where the model would be built: every model-free check passed."""


def test_the_shipped_configs_pass_the_model_free_checks(tmp_path, monkeypatch):
    def reached(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(building, "load_policy", reached)
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        with pytest.raises(Reached):
            building.build_trainer(load_config(path, [f"run_dir={tmp_path}"]), tmp_path, log=lambda m: None)


def test_seeds_at_both_ends_of_the_accepted_range_load():
    assert load_config(None, ["seed=0"]).seed == 0
    assert load_config(None, [f"seed={2**64 - 1}"]).seed == 2**64 - 1
    building.seed_everything(2**64 - 1)  # what torch and numpy are given must be accepted by them


def test_agent_argument_of_the_wrong_type_names_the_argument(tmp_path, no_model):
    err = _run_checks("agent.args.turn_discount", "abc", tmp_path)  # the agent type is chat: not its argument
    assert "agent.args.turn_discount" in str(err)
    cfg = load_config(ROOT / "configs" / "math_retry.yaml", ["agent.args.turn_discount=abc"])
    with pytest.raises(AgentRLError, match=r"^agent\.args\.turn_discount='abc' is rejected by agent type "
                                           r"'math_retry': '<' not supported"):
        building.build_trainer(cfg, tmp_path, log=lambda m: None)


# ------------------------------------------------------------------------- through the CLI
def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "train", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize("args, expected", [
    (["actor.lr=nan"], "actor.lr='nan' must be a finite number"),
    (["actor.lr=1e400"], "actor.lr='1e400' must be a finite number"),
    (["rollout.batch_size=18446744073709551616"], "rollout.batch_size=18446744073709551616 is too large"),
    (["seed=-1"], "seed=-1 is out of range"),
    (["trainer.logger=[foo]"], "trainer.logger[0]='foo' is not allowed"),
    (["rollout.max_model_len=100000"], "rollout.max_model_len=100000 exceeds the model's context of 2048"),
    (["rollout.max_new_tokens=64", "rollout.max_model_len=32"], "rollout.max_new_tokens=64 leaves no room"),
    (["model.warm_start.batch_size=0"], "model.warm_start.batch_size=0 must be a positive integer"),
])
def test_cli_prints_one_line_and_builds_no_model(args, expected, tmp_path):
    res = _cli("configs/frozen_lake.yaml", *args, f"run_dir={tmp_path / 'run'}", f"model.cache_dir={tmp_path / 'cache'}")
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], res.stderr[-2000:]
    assert not (tmp_path / "cache").exists()  # no model was built (or cached)


def test_binary_garbage_config_file_is_one_line(tmp_path):
    path = tmp_path / "garbage.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    res = _cli(str(path), cwd=tmp_path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "garbage.yaml is not a UTF-8 text file" in lines[0], res.stderr[-2000:]


def test_duplicate_yaml_keys_are_an_error_naming_key_and_file(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("trainer:\n  total_steps: 5\n  test_freq: 1\n  total_steps: 50\n")
    res = _cli(str(path), cwd=tmp_path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "dup.yaml" in lines[0] and "key 'total_steps' is given twice (lines 2 and 4)" in lines[0]
    path.write_text("seed: 1\nenv:\n  args: {max_steps: 3, max_steps: 4}\n")
    with pytest.raises(AgentRLError, match="key 'max_steps' is given twice"):
        load_config(path)
    with pytest.raises(AgentRLError, match="key 'a' is given twice"):
        load_config(None, ["env.args={a: 1, a: 2}"])
    # merge keys may still be overridden one by one
    assert load_config(None, ["env.args={<<: {max_steps: 3, is_slippery: false}, max_steps: 4}"]).env.args == {
        "max_steps": 4, "is_slippery": False}


class _NeedsRealTokenizer:
    """An agent whose constructor uses more of the tokenizer than the pre-model check's stand-in has."""

    def __init__(self, tokenizer, sampling, max_turns, system_prompt=None, scale: float = 1.0):
        self.vocab = len(tokenizer)  # TypeError on the stand-in: not the arguments' fault
        self.scale = scale


def test_an_agent_the_stand_in_cannot_build_is_left_to_the_real_build(tmp_path, monkeypatch):
    from agentrl.registry import register_agent

    register_agent("needs_real_tokenizer", _NeedsRealTokenizer, overwrite=True)

    def reached(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(building, "load_policy", reached)
    cfg = load_config(None, ["agent.type=needs_real_tokenizer", "agent.args.scale=2.0", f"run_dir={tmp_path}"])
    with pytest.raises(Reached):
        building.build_trainer(cfg, tmp_path, log=lambda m: None)
