"""engine.kind=vllm as a user writes it: its section's bad values, attach mode and the sampling
vLLM cannot report as the trainer does, each refused in one line naming the field, before any
model is built or any server started."""

import json

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError


@pytest.mark.parametrize("overrides, says", [
    (["engine.vllm.args=[--port=8000]"], "engine.vllm.args holds '--port=8000': agentrl sets --port itself"),
    (["engine.vllm.args=[--host, 0.0.0.0]"], "agentrl sets --host itself (loopback: vLLM's API key does not guard"),
    (["engine.vllm.args=[--dtype, float16]"], "agentrl sets --dtype itself (model.dtype, the trainer's)"),
    (["engine.urls=[http://127.0.0.1:8000]"], "attaches to running servers: set engine.weights_dir"),
    (["engine.urls=[http://127.0.0.1:8000]", "engine.weights_dir=w", "engine.vllm.replicas=2"],
     "engine.vllm.replicas=2 with engine.urls: the run starts no server"),
    (["rollout.top_p=0.9"], "rollout.top_p=0.9 with engine.kind=vllm: vLLM's logprobs are of the filtered"),
    (["rollout.top_k=20"], "rollout.top_k=20 with engine.kind=vllm"),
    (["model.lora.rank=1024"], "model.lora.rank=1024 with engine.kind=vllm: vLLM serves adapters of rank at most 512"),
    (["engine.vllm.probe_tolerance=0"], "engine.vllm.probe_tolerance=0.0 must be > 0"),
    (["engine.vllm.startup_timeout=-1"], "engine.vllm.startup_timeout=-1.0 must be > 0 seconds"),
    (["engine.vllm.replicas=0"], "engine.vllm.replicas=0 must be a positive integer"),
    (["engine.vllm.python=''"], "engine.vllm.python is empty"),
    (["engine.vllm.pyhton=x"], "Did you mean 'engine.vllm.python'?"),
    (["engine.vllm.weight_transfer=ipc"], "engine.vllm.weight_transfer"),
    (["engine.vllm.weight_transfer=nccl", "device=cpu"], "engine.vllm.weight_transfer=nccl broadcasts from the "
                                                          "trainer's GPU, and device=cpu: use engine.vllm.weight_transfer=file"),
])
def test_bad_vllm_settings_fail_in_one_line(overrides, says):
    with pytest.raises(ConfigError) as err:
        load_config("configs/frozen_lake.yaml", ["engine.kind=vllm", *overrides])
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_default_config_takes_engine_kind_vllm():
    cfg = load_config("configs/frozen_lake.yaml", ["engine.kind=vllm", "engine.vllm.args=[--enforce-eager]"])
    assert cfg.engine.vllm.args == ["--enforce-eager"] and cfg.engine.vllm.probe_tolerance == 1e-3


def test_agentrl_plan_describes_the_vllm_servers_and_checks_the_interpreter(tmp_path, capsys):
    from agentrl.cli import main

    # An "interpreter" that has vLLM as far as the preflight can tell (agentrl plan starts no server)
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\ncase "$2" in *find_spec*) exit 0;; esac\nexit 1\n')
    python.chmod(0o755)
    args = ["plan", "configs/frozen_lake.yaml", "engine.kind=vllm", f"engine.vllm.python={python}",
            "engine.vllm.args=[--enforce-eager]", "rollout.max_staleness=1", f"run_dir={tmp_path / 'run'}"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert (f"vllm, 1 server(s) started by the run on loopback with {python} (engine.vllm.python), ready within "
            "900 s; server args --enforce-eager") in text
    assert "each sync: pause (keep), weights from " in text and "then the probe within 0.001 nats" in text
    assert "vLLM's interpreter" in text.splitlines()[-1]
    assert main([*args, "--json"]) == 0
    vllm = json.loads(capsys.readouterr().out)["engine"]["vllm"]
    assert vllm["python"] == str(python) and vllm["pause_mode"] == "keep" and vllm["probe_tolerance"] == 1e-3
    assert not (tmp_path / "run").exists()  # agentrl plan makes nothing
    assert main([*args[:-2], "runtime.kind=ray", "runtime.actor_infer.world_size=2", *args[-1:]]) == 0
    assert "vllm, 2 server(s) started by the engine replicas (one each) with" in capsys.readouterr().out

