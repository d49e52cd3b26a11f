"""LoRA with engine.kind=remote: an `agentrl serve` server takes a LoRA run's adapter on its keyed
/agentrl/adapter route (a safetensors body with the peft config in its header, or a file of its
serve.weights_dir), checked whole against what that config gives the served model before one
tensor is copied; it then generates what a local engine holding the same adapter generates. A
push that does not fit is a 4xx that changes nothing, and the server keeps serving."""

import asyncio
import copy
import json

import httpx
import pytest
import torch

from agentrl.config import LoraConfig
from agentrl.config.serve import ServeConfig
from agentrl.errors import EngineError
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.llm.remote.engine import RemoteEngine
from agentrl.llm.server.app import start_server
from agentrl.llm.weights import ADAPTER_METADATA, adapter_to_bytes, to_bytes
from agentrl.models.lora import ADAPTER_CONFIG, adapter_state, apply_lora

pytest.importorskip("peft")

LORA = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj"])


def _local(model, tok):
    return LocalEngine(copy.deepcopy(model), eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id,
                       tokenizer=tok)


def _adapter(model, scale: float, seed: int) -> dict:
    """The adapter state of `model` wrapped with LORA, its B matrices drawn (peft starts them at 0:
    an adapter that changes nothing would prove nothing)."""
    tuned = apply_lora(copy.deepcopy(model), LORA, seed=0)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in tuned.named_parameters():
            if "lora_B" in name:
                p.copy_(scale * torch.randn(p.shape, generator=gen))
    return adapter_state(tuned)


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("adapters")


@pytest.fixture(scope="module")
def server(tiny_model, tiny_tokenizer, shared_dir):
    handle = start_server(_local(tiny_model, tiny_tokenizer), tiny_tokenizer,
                          ServeConfig(port=0, api_key="k", weights_dir=str(shared_dir)))
    yield handle
    handle.stop()


def _prompt(tok):
    return tok.apply_chat_template([{"role": "user", "content": "P _ _ _"}], add_generation_prompt=True,
                                   return_dict=False)


def _ids(engine, tok):
    sp = SamplingParams(max_new_tokens=12, seed=3, stop_token_ids=(tok.eos_token_id,))
    return asyncio.run(engine.generate(_prompt(tok), sp))


def test_a_pushed_adapter_makes_the_server_generate_as_a_local_engine_holding_it(server, tiny_model, tiny_tokenizer,
                                                                                shared_dir):
    tok = tiny_tokenizer
    remote = RemoteEngine([server.url], api_key="k")
    base = _ids(remote, tok)
    first, second = _adapter(tiny_model, 0.5, seed=1), _adapter(tiny_model, 0.5, seed=2)
    # The first push injects the adapter layers; the server answers as a local engine given it.
    assert remote.load_weights(first) == 1
    mine = _local(tiny_model, tok)
    mine.load_weights(first)
    pushed = _ids(remote, tok)
    assert pushed.token_ids == _ids(mine, tok).token_ids and pushed.versions == [1] * len(pushed.token_ids)
    assert pushed.token_ids != base.token_ids  # the adapter changed what is generated
    # A later push (through the shared folder) copies tensors; the version is the one given.
    by_disk = RemoteEngine([server.url], api_key="k", weights_dir=str(shared_dir))
    assert by_disk.load_weights(second, version=7) == 7
    assert [p.name for p in shared_dir.glob("*.safetensors")] == ["adapter-v7.safetensors"]
    mine.load_weights(second)
    again = _ids(by_disk, tok)
    assert again.token_ids == _ids(mine, tok).token_ids and again.versions == [7] * len(again.token_ids)
    # Whole weights after adapters (the next run on this server, LoRA or not, starts with its base
    # model): the adapters go, and the server answers as the base model again.
    assert remote.load_weights(tiny_model.state_dict(), version=8) == 8
    assert _ids(remote, tok).token_ids == base.token_ids
    assert remote.load_weights(first, version=9) == 9  # and takes adapters again
    assert _ids(remote, tok).token_ids == pushed.token_ids


def _post(server, body: bytes, version: int = 50, key: str = "k") -> httpx.Response:
    return httpx.post(f"{server.url}/agentrl/adapter?version={version}", content=body, timeout=30,
                      headers={"content-type": "application/octet-stream", "authorization": f"Bearer {key}"})


def _hostile(adapter: dict) -> dict[str, bytes]:
    """Adapter bodies that must be refused: (what is wrong) -> body."""
    tensors = {k: v for k, v in adapter.items() if k != ADAPTER_CONFIG}
    config = adapter[ADAPTER_CONFIG]
    name = next(k for k in tensors if "lora_A" in k)
    nan = {**tensors, name: torch.full_like(tensors[name], float("nan"))}
    return {
        "no config": to_bytes(tensors),
        "config not JSON": to_bytes(tensors, {ADAPTER_METADATA: "{not json"}),
        "a list for a config": to_bytes(tensors, {ADAPTER_METADATA: "[1, 2]"}),
        "a tensor missing": adapter_to_bytes({**{k: v for k, v in tensors.items() if k != name},
                                              ADAPTER_CONFIG: config}, ADAPTER_CONFIG),
        "a tensor too many": adapter_to_bytes({**adapter, "base_model.model.extra.lora_A.weight": torch.zeros(2, 2)},
                                              ADAPTER_CONFIG),
        "a wrong shape": adapter_to_bytes({**adapter, name: torch.zeros(3, 3)}, ADAPTER_CONFIG),
        "NaN values": adapter_to_bytes({**nan, ADAPTER_CONFIG: config}, ADAPTER_CONFIG),
        "not safetensors": b"\x05\x00\x00\x00\x00\x00\x00\x00{}",
    }


def test_an_adapter_that_does_not_fit_is_a_4xx_and_changes_nothing(tiny_model, tiny_tokenizer, shared_dir):
    tok = tiny_tokenizer
    handle = start_server(_local(tiny_model, tok), tok, ServeConfig(port=0, api_key="k", weights_dir=str(shared_dir)))
    try:
        remote = RemoteEngine([handle.url], api_key="k")
        before = _ids(remote, tok).token_ids
        adapter = _adapter(tiny_model, 0.5, seed=1)
        # Before any adapter: a config whose targets the model lacks is refused, nothing injected.
        wrong_targets = {**adapter, ADAPTER_CONFIG: {**adapter[ADAPTER_CONFIG], "target_modules": ["no_such_proj"]}}
        cases = {**_hostile(adapter), "targets the model lacks": adapter_to_bytes(wrong_targets, ADAPTER_CONFIG)}
        for what, body in cases.items():
            resp = _post(handle, body)
            assert resp.status_code == 400, (what, resp.status_code, resp.text)
            assert "\n" not in resp.json()["error"]["message"], what
        assert _post(handle, adapter_to_bytes(adapter, ADAPTER_CONFIG), key="wrong").status_code == 401
        refused_path = httpx.post(f"{handle.url}/agentrl/adapter", json={"path": "/etc/passwd", "version": 3},
                                  headers={"authorization": "Bearer k"}, timeout=30)
        assert refused_path.status_code == 400 and "serve.weights_dir" in refused_path.text
        assert _ids(remote, tok).token_ids == before  # nothing changed
        assert httpx.get(f"{handle.url}/health", timeout=30).json()["policy_version"] == 0
        # After the first adapter, a push of the same config's tensors fits; the hostile ones still do not.
        assert remote.load_weights(adapter) == 1
        with_adapter = _ids(remote, tok).token_ids
        for what, body in _hostile(adapter).items():
            assert _post(handle, body).status_code == 400, what
        bigger = _adapter(tiny_model, 0.5, seed=1)
        bigger[ADAPTER_CONFIG] = {**bigger[ADAPTER_CONFIG], "r": 8}
        bigger = {k: (torch.zeros(8, v.shape[1]) if "lora_A" in k else torch.zeros(v.shape[0], 8))
                  if k != ADAPTER_CONFIG else v for k, v in bigger.items()}
        assert _post(handle, adapter_to_bytes(bigger, ADAPTER_CONFIG)).status_code == 400  # another rank
        assert _ids(remote, tok).token_ids == with_adapter
        with pytest.raises(EngineError, match="NaN"):
            nan = {k: (torch.full_like(v, float("nan")) if k != ADAPTER_CONFIG else v) for k, v in adapter.items()}
            remote.load_weights(nan)
        assert _ids(remote, tok).token_ids == with_adapter
    finally:
        handle.stop()


def test_the_header_carries_the_peft_config_as_peft_writes_it(tiny_model):
    adapter = _adapter(tiny_model, 0.5, seed=1)
    body = adapter_to_bytes(adapter, ADAPTER_CONFIG)
    size = int.from_bytes(body[:8], "little")
    header = json.loads(body[8:8 + size])
    assert json.loads(header["__metadata__"][ADAPTER_METADATA]) == adapter[ADAPTER_CONFIG]
    assert header["__metadata__"][ADAPTER_METADATA] and adapter[ADAPTER_CONFIG]["r"] == 4
