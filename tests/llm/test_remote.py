"""RemoteEngine: the InferenceEngine contract over HTTP. Against our server it gives the local
engine's completions, pushes weights (body or shared disk) with versions on every id, routes an
episode's turns to one server, fails over and fails in one line when a server is gone. The vLLM
and SGLang adapters are checked against small apps that speak those servers' documented schemas
(no vLLM or SGLang here)."""

import asyncio
import copy

import pytest
import torch
from fastapi import FastAPI, Request

from agentrl.config.serve import ServeConfig
from agentrl.errors import EngineError
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.llm.remote.engine import RemoteEngine, check_server
from agentrl.llm.server.app import run_app, start_server


def _local(model, tok):
    return LocalEngine(copy.deepcopy(model), eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id,
                       tokenizer=tok)


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory):
    """The folder the servers load weight files from (serve.weights_dir), a run's engine.weights_dir."""
    return tmp_path_factory.mktemp("shared_weights")


@pytest.fixture(scope="module")
def servers(tiny_model, tiny_tokenizer, shared_dir):
    handles = [start_server(_local(tiny_model, tiny_tokenizer), tiny_tokenizer,
                            ServeConfig(port=0, api_key="k", weights_dir=str(shared_dir))) for _ in range(2)]
    yield handles
    for h in handles:
        h.stop()


def _prompt(tok, text):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False)


def _perturbed(model):
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return other


def test_remote_completions_equal_the_local_engines_and_weights_move_with_versions(servers, tiny_model,
                                                                                     tiny_tokenizer, shared_dir):
    tok = tiny_tokenizer
    remote = RemoteEngine([servers[0].url], api_key="k")
    prompt = _prompt(tok, "P _ _ _")
    sp = SamplingParams(max_new_tokens=10, seed=3, stop_token_ids=(tok.eos_token_id,))
    mine = asyncio.run(_local(tiny_model, tok).generate(prompt, sp))
    theirs = asyncio.run(remote.generate(prompt, sp))
    assert theirs.token_ids == mine.token_ids and theirs.logprobs == pytest.approx(mine.logprobs, abs=1e-6)
    # New weights, streamed: the server now answers as the new model, and says which version made each id.
    other = _perturbed(tiny_model)
    assert remote.load_weights(other.state_dict()) == 1 and remote.policy_version == 1
    pushed = asyncio.run(remote.generate(prompt, sp))
    assert pushed.token_ids == asyncio.run(_local(other, tok).generate(prompt, sp)).token_ids
    assert pushed.versions == [1] * len(pushed.token_ids)
    # Through a shared folder: the server reads the file; the version is the one given.
    by_disk = RemoteEngine([servers[0].url], api_key="k", weights_dir=str(shared_dir))
    assert by_disk.load_weights(tiny_model.state_dict(), version=5) == 5
    assert list(shared_dir.glob("*.safetensors")) == [shared_dir / "policy-v5.safetensors"]
    back = asyncio.run(by_disk.generate(prompt, sp))
    assert back.token_ids == mine.token_ids and back.versions == [5] * len(back.token_ids)
    # The control routes: prefix reset, counters, a resumed run's version.
    assert by_disk.reset_prefix_cache()
    metrics = by_disk.pop_metrics()
    assert metrics["perf/engine_requests"] >= 3 and metrics["perf/remote_requests"] == 1
    state = by_disk.state_dict()
    state["policy_version"] = 9
    remote.load_state_dict(state)
    assert asyncio.run(remote.generate(prompt, sp)).versions[0] == 9
    remote.load_weights(tiny_model.state_dict(), version=0)


def test_an_episodes_turns_stay_on_one_server(servers, tiny_tokenizer):
    tok = tiny_tokenizer
    remote = RemoteEngine([s.url for s in servers], api_key="k")
    remote.pop_metrics()  # both servers' counters start at zero

    async def episode(text):
        prompt = _prompt(tok, text)
        for turn in range(3):
            out = await remote.generate(prompt, SamplingParams(max_new_tokens=4, seed=turn))
            prompt = prompt + out.token_ids + tok.encode("\nnext", add_special_tokens=False)

    async def two():
        await asyncio.gather(episode("first episode"), episode("second episode"))
    asyncio.run(two())
    counts = [RemoteEngine([s.url], api_key="k").pop_metrics()["perf/engine_requests"] for s in servers]
    assert counts == [3.0, 3.0]  # one episode per server, all three turns there


def test_a_server_that_is_gone_fails_over_then_fails_in_one_line(tiny_model, tiny_tokenizer):
    tok = tiny_tokenizer
    live = start_server(_local(tiny_model, tok), tok, ServeConfig(port=0))
    dead = start_server(_local(tiny_model, tok), tok, ServeConfig(port=0))
    dead.stop()
    remote = RemoteEngine([live.url, dead.url], max_retries=2, retry_delay=0.01,  # ties rotate: the dead one first
                          api_key=live.admin_key)  # no serve.api_key: generation is open, metrics take the admin key
    out = asyncio.run(remote.generate(_prompt(tok, "x"), SamplingParams(max_new_tokens=3, seed=1)))
    metrics = remote.pop_metrics()
    assert len(out.token_ids) >= 1 and metrics["perf/remote_retries"] == 1  # answered by the live one
    assert metrics["perf/remote_servers_down"] == 1
    live.stop()
    alone = RemoteEngine([live.url], max_retries=1, retry_delay=0.01)
    with pytest.raises(EngineError) as err:
        asyncio.run(alone.generate(_prompt(tok, "x"), SamplingParams(max_new_tokens=3)))
    message = str(err.value)
    assert live.url in message and "not answering" in message and "after 2 tries" in message and "\n" not in message
    with pytest.raises(EngineError, match="not answering /agentrl/weights"):
        alone.load_weights(tiny_model.state_dict())
    assert "does not answer" in check_server(live.url, "agentrl")


def test_a_request_the_server_refuses_fails_at_once_with_its_reason(servers):
    remote = RemoteEngine([servers[0].url], api_key="k", max_retries=3, retry_delay=5.0)
    with pytest.raises(EngineError, match="refused the request .HTTP 400.: .*outside the model's vocabulary"):
        asyncio.run(remote.generate([10**6], SamplingParams(max_new_tokens=2)))
    assert "API key" in check_server(servers[0].url, "agentrl", api_key="wrong")


def _vllm_app(seen):
    """vLLM's /inference/v1/generate, /collective_rpc and /reset_prefix_cache, by their documented schemas."""
    app = FastAPI()

    @app.post("/inference/v1/generate")
    async def generate(request: Request):
        body = await request.json()
        seen.append(("generate", body))
        n = body["sampling_params"]["max_tokens"]
        ids = [7 + i for i in range(n)]
        return {"request_id": "r", "choices": [{"index": 0, "finish_reason": "length", "token_ids": ids,
                "logprobs": {"content": [{"token": "t", "logprob": -0.25 * (i + 1), "bytes": None, "top_logprobs": []}
                                         for i in range(n)]}}]}

    @app.post("/collective_rpc")
    async def rpc(request: Request):
        seen.append(("rpc", await request.json()))
        return {"results": [None]}

    @app.post("/reset_prefix_cache")
    async def reset():
        seen.append(("reset", None))
        return {}

    @app.get("/health")
    async def health():
        return {}
    return app


def _sglang_app(seen):
    """SGLang's /generate (input_ids, return_logprob), /update_weights_from_disk and /flush_cache."""
    app = FastAPI()

    @app.post("/generate")
    async def generate(request: Request):
        body = await request.json()
        seen.append(("generate", body))
        n = body["sampling_params"]["max_new_tokens"]
        rows = [[-0.5, 11 + i, None] for i in range(n)]
        return {"text": "", "output_ids": [r[1] for r in rows],
                "meta_info": {"id": "x", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 3,
                              "completion_tokens": n, "output_token_logprobs": rows}}

    @app.post("/update_weights_from_disk")
    async def update(request: Request):
        seen.append(("update", await request.json()))
        return {"success": True, "message": "ok"}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush():
        return {}

    @app.get("/health")
    async def health():
        return {}
    return app


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
def test_vllm_and_sglang_adapters_speak_their_schemas(protocol, tiny_model, tmp_path):
    seen = []
    handle = run_app((_vllm_app if protocol == "vllm" else _sglang_app)(seen))
    try:
        assert check_server(handle.url, protocol) is None
        remote = RemoteEngine([handle.url], protocol, weights_dir=str(tmp_path), model_config=tiny_model.config)
        sp = SamplingParams(max_new_tokens=3, greedy=True, seed=4, stop_token_ids=(2,), stop=("END",))
        out = asyncio.run(remote.generate([1, 2, 3], sp))
        kind, body = seen[0]
        if protocol == "vllm":
            assert body["token_ids"] == [1, 2, 3]
            assert body["sampling_params"]["temperature"] == 0 and body["sampling_params"]["max_tokens"] == 3
            assert body["sampling_params"]["logprobs"] == 0 and body["sampling_params"]["seed"] == 4
            assert (out.token_ids, out.logprobs, out.finish_reason) == ([7, 8, 9], [-0.25, -0.5, -0.75], "length")
        else:
            assert body["input_ids"] == [1, 2, 3] and body["return_logprob"] is True
            assert body["sampling_params"]["sampling_seed"] == 4 and body["sampling_params"]["stop"] == ["END"]
            assert (out.token_ids, out.logprobs, out.finish_reason) == ([11, 12, 13], [-0.5] * 3, "stop")
        assert out.versions == [0, 0, 0]
        assert remote.load_weights(tiny_model.state_dict()) == 1
        assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "config.json").is_file()
        if protocol == "vllm":
            assert ("rpc", {"method": "reload_weights"}) in seen and ("reset", None) in seen
        else:
            assert ("update", {"model_path": str(tmp_path.resolve())}) in seen
        assert asyncio.run(remote.generate([1], sp)).versions == [1, 1, 1]  # stamped by the client
        assert remote.reset_prefix_cache()
    finally:
        handle.stop()
