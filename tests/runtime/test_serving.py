"""Config errors of serving, each one line naming the field, before any model is built: remote
engine URLs that are malformed or do not answer, server settings, OpenAI-client agent entries."""

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.registry import load_builtins
from agentrl.runtime.assembly.preflight import preflight


@pytest.mark.parametrize("overrides, says", [
    (["engine.kind=remote"], "engine.kind=remote needs engine.urls"),
    (["engine.urls=[ftp://host:1]"], "engine.urls[0]='ftp://host:1' must be an http:// or https:// URL"),
    (["engine.urls=[http://a:1,http://a:1]"], "names a server twice"),
    (["engine.urls=['http://a:99999']"], "is not a URL"),
    (["engine.kind=remote", "engine.urls=[http://a:1]", "engine.protocol=vllm"], "set engine.weights_dir"),
    (["engine.protocol=triton"], "engine.protocol='triton' is not allowed"),
    (["engine.request_timeout=0"], "engine.request_timeout=0.0 must be > 0"),
    (["serve.port=70000"], "serve.port=70000 is too large; at most 65535 is accepted"),
    (["serve.host=0.0.0.0"], "set serve.api_key too"),
    (["serve.host=127.0.0.1.nip.io"], "set serve.api_key too"),  # loopback by its spelling only: not resolved
    (["serve.idle_timeout=0"], "serve.idle_timeout=0.0 must be > 0 seconds (at most 3600 seconds)"),
    (["engine.api_key=k", "engine.api_key_file=k.txt"], "engine.api_key and engine.api_key_file are both set"),
    (["serve.max_tokens=0"], "serve.max_tokens=0 must be a positive integer"),
])
def test_bad_serving_values_fail_in_one_line(overrides, says):
    with pytest.raises(ConfigError) as err:
        load_config("configs/frozen_lake.yaml", overrides)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("overrides, says", [
    (["engine.kind=remote", "engine.urls=[http://127.0.0.1:9]"], "engine.urls[0]=http://127.0.0.1:9 does not answer"),
    (["engine.kind=remote", "engine.urls=[http://127.0.0.1:9]", "engine.api_key_file=no/such/key"],
     "engine.api_key_file=no/such/key: cannot read it"),
    (["agent.type=openai"], "agent.args.entry must be 'module:function'"),
    (["agent.type=openai", "agent.args.entry=examples/openai_frozen_lake:play"], "has no 'play'"),
    (["agent.type=openai", "agent.args.entry=examples/nothing_here:run"], "cannot import 'examples/nothing_here'"),
    (["agent.type=openai", "agent.args.entry=json:dumps"], "is not an async function"),
])
def test_preflight_checks_servers_and_entries_before_any_model(overrides, says):
    load_builtins()
    cfg = load_config("configs/frozen_lake.yaml", overrides)
    with pytest.raises(ConfigError) as err:
        preflight(cfg)  # model-free: runs before the model is built or warm-started
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_usable_entry_passes_preflight():
    load_builtins()
    preflight(load_config("configs/frozen_lake.yaml", ["agent.type=openai",
                                                       "agent.args.entry=examples/openai_frozen_lake:run"]))
