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
