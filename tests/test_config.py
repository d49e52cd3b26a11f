"""Config loading, overrides and validation errors."""

import pytest

from agentrl.config import Config, all_keys, field_docs, load_config
from agentrl.errors import ConfigError


def test_defaults_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 5\ntrainer:\n  total_steps: 7\nenv:\n  args:\n    is_slippery: true\n")
    cfg = load_config(path, ["trainer.total_steps=20", "seed=3", "actor.lr=1e-3", "env.args.size=5"])
    assert cfg.seed == 3 and cfg.trainer.total_steps == 20
    assert cfg.actor.lr == pytest.approx(1e-3) and isinstance(cfg.actor.lr, float)
    assert cfg.env.args == {"is_slippery": True, "size": 5}
    assert cfg.model.tiny.hidden_size == Config().model.tiny.hidden_size


def test_unknown_key_suggests_closest():
    with pytest.raises(ConfigError, match=r"trainer\.totl_steps.*Did you mean 'trainer\.total_steps'"):
        load_config(None, ["trainer.totl_steps=5"])
    with pytest.raises(ConfigError, match="Did you mean 'trainer.total_steps'"):
        load_config(None, ["total_step=5"])


def test_unknown_key_in_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  group_sise: 4\n")
    with pytest.raises(ConfigError, match="rollout.group_size"):
        load_config(path)


@pytest.mark.parametrize("override, field", [
    ("seed=abc", "seed"), ("trainer.total_steps=1.5", "trainer.total_steps"),
    ("trainer.progress=maybe", "trainer.progress"), ("actor.lr=fast", "actor.lr"),
])
def test_wrong_type_names_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(None, [override])


def test_bad_enum_lists_choices():
    with pytest.raises(ConfigError, match="'float32', 'bfloat16'"):
        load_config(None, ["model.dtype=fp16"])


def test_impossible_combinations():
    with pytest.raises(ConfigError, match="not a multiple of rollout.group_size=8"):
        load_config(None, ["rollout.batch_size=30"])
    with pytest.raises(ConfigError, match="top_p"):
        load_config(None, ["rollout.top_p=0"])
    with pytest.raises(ConfigError, match="model.path"):
        load_config(None, ["model.path=/nonexistent/model"])


def test_yaml_syntax_error_is_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("trainer:\n  total_steps: [1, 2\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "YAML syntax error" in str(e.value) and "\n" not in str(e.value)


def test_every_field_is_documented():
    docs = field_docs()
    assert {k for k, _, _ in docs} == set(all_keys())
    missing = [k for k, _, d in docs if not d]
    assert not missing, f"undocumented config fields: {missing}"


def test_every_shipped_config_loads_and_plans_its_groups():
    from pathlib import Path

    for path in sorted((Path(__file__).parents[1] / "configs").glob("*.yaml")):
        cfg = load_config(path)
        plan = cfg.group_tags("train")
        assert len(plan) == cfg.rollout.batch_size // cfg.rollout.group_size, path
        assert len(cfg.group_tags("val")) == cfg.trainer.eval_episodes, path
    mixed = load_config(Path(__file__).parents[1] / "configs" / "mixed.yaml")
    assert mixed.group_tags("train") == ["frozen_lake", "frozen_lake", "sokoban", "math"]
    assert mixed.agent_for("math").type == "math_retry" and mixed.agent_for("sokoban").type == "chat"


def test_named_sections_from_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("custom_envs:\n  a: {type: frozen_lake, max_turns: 3}\n  b:\n    type: math\n"
                    "    agent: {type: math_retry, args: {turn_discount: 0.5}}\n")
    cfg = load_config(path, ["custom_envs.b.args.max_operand=4", "custom_envs.c.type=math",
                             "custom_envs.a.agent.system_prompt=Be brief.", "train_env_manager.n_groups=[2, 1, 1]",
                             "trainer.eval_episodes=30"])
    assert list(cfg.custom_envs) == ["a", "b", "c"]
    assert cfg.custom_envs["b"].args == {"max_operand": 4} and cfg.custom_envs["b"].max_turns == 8
    assert cfg.agent_for("a").system_prompt == "Be brief." and cfg.agent_for("a").type == "chat"
    assert cfg.agent_for("b").args == {"turn_discount": 0.5} and cfg.agent_for("c") is cfg.agent
    with pytest.raises(ConfigError, match="custom_envs.b.max_turns='x' must be an integer"):
        load_config(path, ["custom_envs.b.max_turns=x"])  # checked while loading, before validation


# ---------------------------------------------------------------------------- the engine section
def test_engine_knobs_live_in_their_own_section():
    cfg = load_config(None, ["engine.max_num_seqs=4", "engine.kv_on_weight_update=keep"])
    assert (cfg.engine.max_num_seqs, cfg.engine.kv_on_weight_update) == (4, "keep")
    assert "engine.max_total_tokens" in all_keys() and "rollout.max_num_seqs" not in all_keys()
    assert not hasattr(cfg.rollout, "max_num_seqs")


@pytest.mark.parametrize("key, value", [("max_num_seqs", 8), ("max_num_batched_tokens", 1024),
                                        ("max_total_tokens", 512), ("enable_prefix_caching", "false"),
                                        ("kv_on_weight_update", "keep")])
def test_an_engine_knob_under_its_old_rollout_name_is_one_line_naming_the_new_key(tmp_path, key, value):
    path = tmp_path / "old.yaml"
    path.write_text(f"rollout:\n  {key}: {value}\n")
    expected = f"unknown config key 'rollout.{key}'. Did you mean 'engine.{key}'?"
    for args in ((path,), (None, [f"rollout.{key}={value}"])):
        with pytest.raises(ConfigError) as err:
            load_config(*args)
        assert str(err.value) == expected
    load_config(None, [f"engine.{key}={value}"])  # the new name takes the same value


def test_an_unknown_key_names_the_same_field_of_another_section_first():
    with pytest.raises(ConfigError, match=r"unknown config key 'actor.group_size'. Did you mean "
                                          r"'rollout.group_size'\?"):
        load_config(None, ["actor.group_size=4"])
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout.max_new_token'. Did you mean "
                                          r"'rollout.max_new_tokens'\?"):
        load_config(None, ["rollout.max_new_token=4"])
