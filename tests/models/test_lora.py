"""LoRA: config errors in one line before any model is built; the adapter state an engine gets
makes it serve exactly the trained policy, without touching its base weights."""

import asyncio
import copy

import pytest
import torch

from agentrl.config import LoraConfig, load_config
from agentrl.errors import ConfigError
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.models.lora import ADAPTER_CONFIG, adapter_state, apply_lora, is_adapter_state
from agentrl.runtime.assembly.trainer import build_trainer
from agentrl.train.actor import Reference, token_logprobs
from agentrl.train.batch import pack
from agentrl.train.forward import ForwardOptions
from agentrl.trajectory import Trajectory


@pytest.mark.parametrize("override, field", [
    ("model.lora.rank=-1", "model.lora.rank=-1"),
    ("model.lora.dropout=1.0", "model.lora.dropout=1.0"),
    ("model.lora.alpha=0", "model.lora.alpha=0"),
    ("model.lora.target_modules=[]", "model.lora.target_modules=[]"),
    ("model.lora.target_modules=[all-linear,q_proj]", "model.lora.target_modules="),
    ("actor.max_tokens_per_micro_batch=-1", "actor.max_tokens_per_micro_batch=-1"),
])
def test_bad_lora_and_budget_values_are_one_line_naming_the_field(override, field):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["model.lora.rank=8", override])
    assert str(err.value).startswith(field) and "\n" not in str(err.value)


def test_a_target_module_that_matches_nothing_fails_before_any_model_is_built(tmp_path):
    cfg = load_config("configs/frozen_lake.yaml", ["model.lora.rank=8", "model.lora.target_modules=[q_proj,qkv_proj]",
                                                   f"model.cache_dir={tmp_path}"])
    with pytest.raises(ConfigError) as err:
        build_trainer(cfg, tmp_path / "run", log=lambda m: None)
    message = str(err.value)
    assert message.startswith("model.lora.target_modules: 'qkv_proj' matches no linear layer") and "\n" not in message
    assert "q_proj" in message.split("layers are")[1]  # says what would be accepted
    assert not any(tmp_path.iterdir())  # no tiny model was built or warm-started, no run folder made


def test_an_engine_given_the_adapter_state_serves_the_trained_policy(tiny_model, tiny_tokenizer):
    base_weights = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    policy = apply_lora(copy.deepcopy(tiny_model), LoraConfig(rank=4, alpha=8.0), seed=0)
    engine = LocalEngine(copy.deepcopy(tiny_model), eos_token_ids=(tiny_tokenizer.eos_token_id,),
                         pad_token_id=tiny_tokenizer.pad_token_id, tokenizer=tiny_tokenizer)
    prompt = tiny_tokenizer.encode("user\nFrozenLake. Move P to G", add_special_tokens=False)
    sampling = SamplingParams(max_new_tokens=6, seed=3)
    assert engine.load_weights(adapter_state(policy)) == 1  # injects the adapter layers (B = 0: no change yet)
    before = asyncio.run(engine.generate(prompt, sampling))
    with torch.no_grad():  # an update: B is zero at initialisation
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(len(name)))
    state = adapter_state(policy)
    assert is_adapter_state(state) and state[ADAPTER_CONFIG]["r"] == 4
    assert all("lora_" in k for k in state if k != ADAPTER_CONFIG)  # no base weight travels
    assert engine.load_weights(state) == 2  # copies the new adapter tensors into the injected layers
    after = asyncio.run(engine.generate(prompt, sampling))

    def trainer_logprobs(model, completion):
        ids = torch.tensor([prompt + completion.token_ids])
        with torch.no_grad():
            return token_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt):]

    torch.testing.assert_close(torch.tensor(after.logprobs), trainer_logprobs(policy, after), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.tensor(before.logprobs), trainer_logprobs(tiny_model, before),
                               rtol=1e-5, atol=1e-5)
    assert not torch.allclose(trainer_logprobs(policy, after), trainer_logprobs(tiny_model, after), atol=1e-3)
    served = engine.model.state_dict()
    for name, value in base_weights.items():  # the engine's base weights are never reloaded
        key = name.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
        assert torch.equal(served[key if key in served else name], value), name


def test_the_reference_of_a_lora_policy_is_its_base_without_a_copy(tiny_model):
    policy = apply_lora(copy.deepcopy(tiny_model), LoraConfig(rank=4), seed=0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.fill_(0.05)
    ids = [5 + (3 * k) % 200 for k in range(12)]
    batch = pack([Trajectory(ids, [0] * 6 + [1] * 6, [0.0] * 12, [0] * 12, [1.0], [11], 0, 0)], pad_token_id=0)
    reference = Reference(policy, ForwardOptions(4), temperature=1.0)
    assert reference.model is policy  # no second copy of the model
    ref = reference.compute_logprobs(batch)
    torch.testing.assert_close(ref, token_logprobs(tiny_model, batch.input_ids, batch.attention_mask),
                               rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        adapted = token_logprobs(policy, batch.input_ids, batch.attention_mask)
    assert not torch.allclose(ref, adapted, atol=1e-3)  # the adapters are on again afterwards
