"""engine.vllm.weight_transfer=nccl on a machine without CUDA: what can be checked here. The
broadcast itself needs GPUs and vLLM's CUDA build (not installable on our machines); the
payloads our sender gives vLLM's routes are parsed by vLLM's own dataclasses (its CPU build
ships them), the servers start with vLLM's NCCL backend, and a CPU run is refused in one line
before any server starts."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from agentrl.config import load_config
from agentrl.errors import ConfigError, EngineError
from agentrl.llm.vllm.launch import VllmServer
from agentrl.llm.vllm.nccl import init_payloads, update_info

ROOT = Path(__file__).parents[2]
VLLM_PYTHON = os.environ.get("AGENTRL_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))

# vLLM's side: parse each init payload and the update info as its NCCL engine does, and read
# every dtype name back as its receiver does (getattr(torch, name)).
PARSE = """
import json, sys, torch
from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferInitInfo, NCCLWeightTransferUpdateInfo
inits, update = json.load(sys.stdin)
parsed = [NCCLWeightTransferInitInfo(**p) for p in inits]
info = NCCLWeightTransferUpdateInfo(**update)
print(json.dumps({"ranks": [p.rank_offset for p in parsed], "world": [p.world_size for p in parsed],
                  "uid_bytes": [len(p.nccl_unique_id_bytes) for p in parsed], "packed": [p.packed for p in parsed],
                  "dtypes": [str(getattr(torch, d)) for d in info.dtype_names], "shapes": info.shapes,
                  "names": info.names}))
"""


def test_vllm_parses_what_the_sender_gives_its_routes():
    if not Path(VLLM_PYTHON).is_file():
        pytest.skip(f"no vLLM environment at {VLLM_PYTHON}: run `make vllm` (or set AGENTRL_VLLM_PYTHON)")
    state = {"model.embed_tokens.weight": torch.zeros(10, 4), "lm_head.weight": torch.zeros(10, 4, dtype=torch.bfloat16),
             "model.norm.weight": torch.zeros(4, dtype=torch.float16)}
    inits = init_payloads(bytes(range(128)), workers=[1, 2])  # a server of one worker, one of two (TP 2)
    done = subprocess.run([VLLM_PYTHON, "-c", PARSE], input=json.dumps([inits, update_info(state)]),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["ranks"] == [1, 2] and got["world"] == [4, 4]  # the trainer is rank 0, then 1 + 2 workers
    assert got["uid_bytes"] == [128, 128] and got["packed"] == [False, False]
    assert got["names"] == list(state)
    assert got["dtypes"] == [str(t.dtype) for t in state.values()]
    assert got["shapes"] == [list(t.shape) for t in state.values()]


def test_a_unique_id_of_the_wrong_size_is_refused():
    with pytest.raises(EngineError, match="an NCCL unique id is 128 bytes, not 16"):
        init_payloads(bytes(16), workers=[1])


def test_servers_start_with_vllms_nccl_backend(tmp_path):
    cmd = VllmServer(tmp_path / "model", tmp_path, python="python", transfer="nccl").command()
    assert cmd[cmd.index("--weight-transfer-config") + 1] == json.dumps({"backend": "nccl"})
    default = VllmServer(tmp_path / "model", tmp_path, python="python").command()
    assert default[default.index("--weight-transfer-config") + 1] == json.dumps({"backend": "agentrl_file"})
    with pytest.raises(EngineError, match="unknown weight transport 'ipc'; known: agentrl_file, nccl"):
        VllmServer(tmp_path / "model", tmp_path, python="python", transfer="ipc")


def test_a_run_training_on_a_cpu_is_refused_before_any_server_starts(tmp_path, tiny_tokenizer):
    from agentrl.config import TinyModelConfig
    from agentrl.models.tiny import build_model
    from agentrl.runtime.assembly.vllm_engine import vllm_engine
    from agentrl.runtime.assembly.plan import plan

    if not Path(VLLM_PYTHON).is_file():  # the plan checks that the interpreter can start vLLM
        pytest.skip(f"no vLLM environment at {VLLM_PYTHON}: run `make vllm` (or set AGENTRL_VLLM_PYTHON)")
    # device=auto on a machine without CUDA: the config check cannot know, the build step does
    cfg = load_config("configs/frozen_lake.yaml", ["engine.kind=vllm", "engine.vllm.weight_transfer=nccl",
                                                   f"engine.vllm.python={VLLM_PYTHON}", f"run_dir={tmp_path / 'run'}"])
    model = build_model(TinyModelConfig(num_hidden_layers=1), tiny_tokenizer, seed=0)
    with pytest.raises(ConfigError) as err:
        vllm_engine(plan(cfg), model, tiny_tokenizer)
    assert str(err.value).startswith("engine.vllm.weight_transfer=nccl broadcasts from the trainer's GPU, and this "
                                     "run trains on cpu") and "\n" not in str(err.value)
    assert not (tmp_path / "run" / "vllm").exists()  # no server was started, no model written for one
