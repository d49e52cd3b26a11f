"""The warm-started tiny model is cached by what it depends on, not by how the config spells it."""

from pathlib import Path

from agentrl.config import load_config
from agentrl.models.embedded import tiny_cache_key

CONFIGS = Path(__file__).parents[2] / "configs"


def test_frozen_lake_yaml_shares_the_default_warm_start():
    # configs/frozen_lake.yaml says "Every value here equals the dataclass default".
    assert "equals the dataclass default" in (CONFIGS / "frozen_lake.yaml").read_text()
    assert tiny_cache_key(load_config(CONFIGS / "frozen_lake.yaml")) == tiny_cache_key(load_config(None))


def test_spelling_out_a_default_argument_keeps_the_key_and_changing_it_does_not():
    default = tiny_cache_key(load_config(None))
    assert tiny_cache_key(load_config(None, ["env.args.max_steps=8", "env.args.is_slippery=false"])) == default
    assert tiny_cache_key(load_config(None, ["env.args.max_steps=9"])) != default
    assert tiny_cache_key(load_config(None, ["agent.type=math_retry", "env.type=math"])) != default
    assert tiny_cache_key(load_config(None, ["model.warm_start.demo_pool=0"])) == default
    assert tiny_cache_key(load_config(None, ["model.warm_start.demo_pool=50"])) != default


def test_the_cache_key_is_pinned_so_cached_warm_starts_stay_valid():
    # A change of the key rebuilds every user's cached model (minutes each): change it on purpose
    # only (WARM_START_VERSION, or a new env argument, whose default joins the hashed arguments:
    # last changed by runtime.num_threads joining the key: a model cached before was warm-started on
    # however many threads torch took on that machine).
    assert tiny_cache_key(load_config(CONFIGS / "frozen_lake.yaml")) == "e5e1163df2b89cdc"
    assert tiny_cache_key(load_config(CONFIGS / "mixed.yaml")) == "9b918a3aa663952e"


def test_the_thread_count_is_part_of_the_key():
    # CPU kernels add up in another order on another thread count: another warm-started model.
    assert tiny_cache_key(load_config(None, ["runtime.num_threads=2"])) != tiny_cache_key(load_config(None))
