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
import functools
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

import agentrl.runtime.assembly.policy as policy
import agentrl.runtime.assembly.trainer as building
import agentrl.warm_start.recipe as recipe
from agentrl.config import Config, load_config
from agentrl.config.loading import _field_types
from agentrl.errors import AgentRLError
from agentrl.runtime.process import seed_everything

ROOT = Path(__file__).parents[1]
HUGE = str(2**64)  # beyond int64, beyond every seed torch accepts


@functools.cache  # read by every case's generator: the schema walk once, not once per call
def _leaf_types(cls: type = Config, prefix: str = "") -> dict[str, Any]:
    """{dotted key: type} of every leaf field."""
    out = {}
    types_of = _field_types(cls)
    for f in dataclasses.fields(cls):
        tp = types_of[f.name]
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
    # values a reliability pass found unchecked: torch failed after the model build, or the run trained on
    ("critic.lr", "-1"), ("critic.weight_decay", "-1"), ("critic.grad_clip", "-1"), ("critic.cliprange_value", "-1"),
    ("actor.kl_loss_coef", "-5"), ("actor.entropy_coeff", "-1"), ("rollout.episode_timeout", "1e300"),
    ("engine.request_timeout", "1e300"), ("algorithm.step_adv_weight", "-1"), ("actor.clip_ratio_low", "1.5"),
    # sizes far beyond sense that hung in the env's own loops (FrozenLake's value iteration)
    ("env.args.max_steps", str(10**21)), ("env.args.step_reward", "1.0e+300"),
    # paths and strings: empty where the field has a meaning, beyond what a file system names, other users' homes
    ("run_dir", '""'), ("exp_name", '""'), ("output_dir", '""'), ("model.path", '""'), ("model.cache_dir", '""'),
    ("engine.weights_dir", '""'), ("imports", '[""]'), ("exp_name", "../elsewhere"), ("exp_name", "/an/absolute/path"),
    ("run_dir", "~no_such_user_xyz/run"), ("model.path", "~no_such_user_xyz/model"),
    ("model.cache_dir", "~no_such_user_xyz/cache"), ("run_dir", "/tmp/" + "x" * 300), ("output_dir", "x" * 256),
    ("exp_name", "x" * 300), ("model.cache_dir", "/tmp/" + "x" * 300 + "/cache"), ("model.path", "/" + "x" * 300),
    ("run_dir", "/tmp" + "/x" * 2100), ("imports", "[/tmp/" + "x" * 300 + ".py]"), ("run_dir", '"a\\0b"'),
    ("engine.api_key", "ключ"), ("engine.api_key", '"a key"'), ("engine.api_key", '""'), ("serve.api_key", "ключ"),
    ("runtime.temp_dir", "/tmp/ray"),  # only Ray's: runtime.kind=local would ignore it
]
# Far beyond every bound: a float this size is no learning rate, timeout or coefficient, an int no size.
FAR = {float: ("-1e30", "1e30"), int: ("-" + str(10**18), str(10**18))}


def _numeric_fields() -> dict[str, type]:
    """{dotted key: int or float} of every numeric leaf field (list items included)."""
    out = {}
    for key, tp in _leaf_types().items():
        base = _base(tp)
        if typing.get_origin(base) is list:
            base = _base(typing.get_args(base)[0])
            key = f"{key}"
        if base in (int, float):
            out[key] = base
    return out


def _far_cases() -> list[tuple[str, str]]:
    cases = []
    for key, tp in _numeric_fields().items():
        for value in FAR[tp]:
            if key == "seed" and not value.startswith("-"):
                continue  # every seed up to 2^64 - 1 is a seed
            is_list = typing.get_origin(_base(_leaf_types()[key])) is list
            cases.append((key, f"[{value}]" if is_list else value))
    return cases


def _cases() -> list[tuple[str, str]]:
    cases = [(key, value) for key, tp in _leaf_types().items() for value in _bad_values(tp)]
    return cases + SEMANTIC + _far_cases()


@pytest.fixture
def no_model(monkeypatch):
    """build_trainer with a tripwire where the model would be built or warm-started."""
    def tripwire(*args, **kwargs):
        raise AssertionError("the model was about to be built: this check runs too late")
    monkeypatch.setattr(policy, "load_policy", tripwire)
    monkeypatch.setattr(recipe, "build_tiny", tripwire)


def _field_in(message: str, key: str) -> bool:
    """The message names the field (a list item 'key[0]' or an env/agent argument counts)."""
    parent, _, leaf = key.rpartition(".")
    return key in message or bool(parent) and parent in message and leaf in message


def _run_checks(key: str, value: str, tmp_path: Path) -> AgentRLError:
    with pytest.raises(AgentRLError) as err:
        cfg = load_config(ROOT / "configs" / "frozen_lake.yaml", [f"run_dir={tmp_path}", f"{key}={value}"])
        building.build_trainer(cfg, tmp_path, log=lambda m: None)
    return err.value


def test_the_fuzz_covers_every_field():
    keys = {k for k, _ in _cases()}
    assert keys >= set(_leaf_types()), set(_leaf_types()) - keys
    assert len(_cases()) > 600
    assert {k for k, _ in _far_cases()} == set(_numeric_fields())  # every number, far out of range


@pytest.mark.parametrize("shape", [
    dict(hidden_size=16384, num_hidden_layers=256, num_attention_heads=128, num_key_value_heads=128,
         intermediate_size=65536),  # each within its own bound: about 1e12 parameters
    dict(hidden_size=8192, num_hidden_layers=32, num_attention_heads=64, num_key_value_heads=8, intermediate_size=28672),
])
def test_a_tiny_model_too_large_as_a_whole_is_one_line(shape, tmp_path, no_model):
    err = str(_run_checks("model.tiny", "{" + ", ".join(f"{k}: {v}" for k, v in shape.items()) + "}", tmp_path))
    assert "\n" not in err and "parameters" in err and "model.tiny.hidden_size=" in err and "model.path" in err, err


def test_the_tiny_models_parameter_count_is_the_models_own():
    from agentrl.config.limits import tiny_parameters
    from agentrl.config.model import TinyModelConfig
    from agentrl.models.lora import skeleton
    from agentrl.models.tiny import tiny_config

    for tiny in (TinyModelConfig(), TinyModelConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=8,
                                                    num_key_value_heads=2, intermediate_size=96, vocab_size=333)):
        model = skeleton(tiny_config(tiny, tiny.vocab_size))
        assert tiny_parameters(tiny) == sum(p.numel() for p in model.parameters())


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


@pytest.mark.parametrize("overrides, expected", [
    (["env.args.max_steps=1000000000000000000000"], "frozen_lake: max_steps=1000000000000000000000 is invalid"),
    (["env.args={map_name: null, size: 16, is_slippery: true, max_steps: 100000000}"], "max_steps=100000000"),
    (["env.type=sokoban", "env.args.num_gen_steps=1000000000000"], "sokoban: num_gen_steps=1000000000000"),
    (["env.type=sokoban", "env.args.search_depth=1000000000000"], "sokoban: search_depth=1000000000000"),
    (["env.type=sokoban", "env.args.max_steps=1000000000000"], "sokoban: max_steps=1000000000000"),
    (["env.type=sokoban", "env.args.max_solution_moves=1000000000000"], "sokoban: max_solution_moves="),
    (["env.type=sokoban", "env.args.success_reward=1.0e+300"], "sokoban: success_reward=1e+300"),
    (["env.type=math", "env.args.num_ops=1000000000"], "math: num_ops=1000000000"),
    (["env.type=math", "env.args.max_operand=" + "9" * 400], "math: max_operand=999"),
    (["env.type=math", "env.args.timeout=1.0e+300"], "math: timeout=1e+300"),
    (["runtime.kind=ray", "runtime.address=garbage"], "runtime.address='garbage' is not a Ray cluster address"),
    (["runtime.kind=ray", 'runtime.address=""'], "runtime.address='' is not a Ray cluster address"),
    (["runtime.kind=ray", "runtime.address=10.0.0.1:70000"], "runtime.address='10.0.0.1:70000' is not a Ray"),
    (["runtime.kind=ray", "runtime.address=http://head:6379"], "is not a Ray cluster address"),
])
def test_sizes_and_addresses_beyond_sense_are_one_line_before_the_model(overrides, expected, tmp_path, no_model):
    with pytest.raises(AgentRLError) as err:
        cfg = load_config(None, [*overrides, f"run_dir={tmp_path}"])  # the defaults: env.args left empty
        building.build_trainer(cfg, tmp_path, log=lambda m: None)
    assert expected in str(err.value) and "\n" not in str(err.value) and len(str(err.value)) < 1000, str(err.value)


def test_ray_addresses_of_every_form_ray_joins_are_accepted():
    for address in ("auto", "10.0.0.1:6379", "head-node.cluster:6379", "ray://head:10001", "ray://10.0.0.1",
                    "[::1]:6379"):
        assert load_config(None, ["runtime.kind=ray", f"runtime.address={address}"]).runtime.address == address


def test_the_shipped_configs_pass_the_model_free_checks(tmp_path, monkeypatch):
    def reached(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(policy, "load_policy", reached)
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        with pytest.raises(Reached):
            building.build_trainer(load_config(path, [f"run_dir={tmp_path}"]), tmp_path, log=lambda m: None)


def test_seeds_at_both_ends_of_the_accepted_range_load():
    assert load_config(None, ["seed=0"]).seed == 0
    assert load_config(None, [f"seed={2**64 - 1}"]).seed == 2**64 - 1
    seed_everything(2**64 - 1)  # what torch and numpy are given must be accepted by them


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
    (["critic.lr=-1"], "critic.lr=-1.0 is out of range; it must be in [0, 10]"),
    (["actor.kl_loss_coef=-5"], "actor.kl_loss_coef=-5.0 is out of range; it must be in [0, 1000]"),
    (["model.tiny.hidden_size=16384", "model.tiny.num_hidden_layers=256", "model.tiny.num_attention_heads=128",
      "model.tiny.num_key_value_heads=128"], "the embedded tiny model takes at most 1e+09"),
])
def test_cli_prints_one_line_and_builds_no_model(args, expected, tmp_path):
    res = _cli("configs/frozen_lake.yaml", *args, f"run_dir={tmp_path / 'run'}", f"model.cache_dir={tmp_path / 'cache'}")
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], res.stderr[-2000:]
    assert not (tmp_path / "cache").exists()  # no model was built (or cached)


def _alias_bomb(levels: int) -> str:
    """A few hundred bytes of YAML whose aliases expand to 9^levels strings, under env.args."""
    text = 'env:\n  args:\n    a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for i in range(1, levels):
        text += f"    a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n"
    return text + f"seed: *a{levels - 1}\n"


@pytest.mark.parametrize("text, expected", [
    (_alias_bomb(9), "expands to more than 100000 values"),  # 9^9 strings: gigabytes once printed
    ("a: &a [*a]\n", "holds an alias inside the value it names"),
    ("seed: " + "[" * 5000 + "]" * 5000 + "\n", "nests deeper than 64 levels"),
    ("seed: " + "9" * 5000 + "\n", "holds a value it cannot read"),
    ('seed: "' + "x" * 1_000_000 + '"\n', "seed='xxxx"),
])
def test_yaml_beyond_what_a_config_needs_is_one_short_line(text, expected, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert len(path.read_bytes()) < 600 or expected.startswith(("nests", "holds a value", "seed="))
    res = _cli(str(path), f"run_dir={tmp_path / 'run'}")
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and len(lines[0]) < 1000, res.stderr[-2000:]


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

    def __init__(self, tokenizer, sampling, max_turns, system_prompt=None, budget=None, scale: float = 1.0):
        self.vocab = len(tokenizer)  # TypeError on the stand-in: not the arguments' fault
        self.scale = scale


def test_an_agent_the_stand_in_cannot_build_is_left_to_the_real_build(tmp_path, monkeypatch):
    from agentrl.registry import register_agent

    register_agent("needs_real_tokenizer", _NeedsRealTokenizer, overwrite=True)

    def reached(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(policy, "load_policy", reached)
    cfg = load_config(None, ["agent.type=needs_real_tokenizer", "agent.args.scale=2.0", f"run_dir={tmp_path}"])
    with pytest.raises(Reached):
        building.build_trainer(cfg, tmp_path, log=lambda m: None)


class _NoBudget:
    """An agent whose constructor does not take `budget`."""

    def __init__(self, tokenizer, sampling, max_turns, system_prompt=None):
        self.tokenizer = tokenizer


def test_an_agent_whose_constructor_takes_no_budget_is_one_line_before_the_model(tmp_path, no_model):
    from agentrl.registry import register_agent

    register_agent("no_budget", _NoBudget, overwrite=True)
    cfg = load_config(None, ["agent.type=no_budget", f"run_dir={tmp_path}"])
    with pytest.raises(AgentRLError, match=r"^agent\.type: agent type 'no_budget' \(_NoBudget\) cannot be built: "
                                           r"its constructor must accept `budget`") as err:
        building.build_trainer(cfg, tmp_path, log=lambda m: None)
    assert "\n" not in str(err.value)
