"""The local engine: batched generation equals model.generate; seeds reproduce; logprobs agree."""

import asyncio

import pytest
import torch

from agentrl.errors import EngineError
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local import LocalEngine
from agentrl.train.actor import token_logprobs


def _engine(model, tok, **kw):
    return LocalEngine(model, eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id, **kw)


def _prompts(tok):
    texts = ["P _ _ _", "user\n_ O _ O\n_ _ _ O", "What is 12 + 7?", "Left Right Up Down Left Right"]
    return [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                    return_dict=False) for t in texts]


async def _gather(engine, prompts, params):
    return await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params)))


def test_greedy_matches_model_generate_in_one_batch(tiny_model, tiny_tokenizer):
    engine = _engine(tiny_model, tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer)
    params = [SamplingParams(greedy=True, max_new_tokens=12)] * len(prompts)
    outs = asyncio.run(_gather(engine, prompts, params))
    assert engine.stats.batches == 1  # all four were decoded together
    for p, out in zip(prompts, outs):
        ref = tiny_model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                  max_new_tokens=12, do_sample=False, eos_token_id=tiny_tokenizer.eos_token_id,
                                  pad_token_id=tiny_tokenizer.pad_token_id)
        assert out.token_ids == ref[0, len(p):].tolist()[: len(out.token_ids)]
        assert out.finish_reason in ("stop", "length")
        assert len(out.logprobs) == len(out.token_ids)


def test_same_seed_same_output_whatever_the_batch(tiny_model, tiny_tokenizer):
    prompts = _prompts(tiny_tokenizer)
    s = SamplingParams(temperature=1.0, max_new_tokens=10, seed=1234)
    alone = asyncio.run(_engine(tiny_model, tiny_tokenizer).generate(prompts[0], s))
    batched = asyncio.run(_gather(_engine(tiny_model, tiny_tokenizer), prompts,
                                  [s] + [SamplingParams(max_new_tokens=10, seed=k) for k in range(3)]))
    assert batched[0].token_ids == alone.token_ids
    other = asyncio.run(_engine(tiny_model, tiny_tokenizer).generate(prompts[0], SamplingParams(
        max_new_tokens=10, seed=99)))
    assert other.token_ids != alone.token_ids or other.logprobs != alone.logprobs


def test_engine_logprobs_equal_trainer_recomputation(tiny_model, tiny_tokenizer):
    engine = _engine(tiny_model, tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer)
    params = [SamplingParams(temperature=0.7, max_new_tokens=10, seed=k) for k in range(len(prompts))]
    outs = asyncio.run(_gather(engine, prompts, params))
    for p, out in zip(prompts, outs):
        ids = torch.tensor([p + out.token_ids])
        with torch.no_grad():
            lp = token_logprobs(tiny_model, ids, torch.ones_like(ids), temperature=0.7)[0, len(p):]
        assert torch.allclose(lp, torch.tensor(out.logprobs), atol=1e-5)


def test_top_k_one_is_greedy(tiny_model, tiny_tokenizer):
    p = _prompts(tiny_tokenizer)[1]
    greedy = asyncio.run(_engine(tiny_model, tiny_tokenizer).generate(p, SamplingParams(greedy=True, max_new_tokens=8)))
    topk = asyncio.run(_engine(tiny_model, tiny_tokenizer).generate(p, SamplingParams(top_k=1, max_new_tokens=8, seed=5)))
    assert topk.token_ids == greedy.token_ids


def test_max_new_tokens_and_stop_ids(tiny_model, tiny_tokenizer):
    p = _prompts(tiny_tokenizer)[0]
    out = asyncio.run(_engine(tiny_model, tiny_tokenizer).generate(p, SamplingParams(max_new_tokens=3, seed=1)))
    assert len(out.token_ids) <= 3
    assert out.finish_reason == ("stop" if tiny_tokenizer.eos_token_id in out.token_ids else "length")
    first = out.token_ids[0]
    stopped = asyncio.run(_engine(tiny_model, tiny_tokenizer).generate(
        p, SamplingParams(max_new_tokens=3, seed=1, stop_token_ids=(first,))))
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"


def test_context_overflow_is_a_clear_error(tiny_model, tiny_tokenizer):
    engine = _engine(tiny_model, tiny_tokenizer, max_model_len=32)
    with pytest.raises(EngineError, match="exceeds the model's context of 32"):
        asyncio.run(engine.generate(list(range(5, 35)), SamplingParams(max_new_tokens=8)))


def test_load_weights_bumps_version_and_changes_output(tiny_model, tiny_tokenizer):
    import copy

    engine = _engine(copy.deepcopy(tiny_model), tiny_tokenizer)
    p = _prompts(tiny_tokenizer)[2]
    s = SamplingParams(greedy=True, max_new_tokens=6)
    before = asyncio.run(engine.generate(p, s))
    sd = {k: v + 0.05 * torch.randn_like(v) for k, v in tiny_model.state_dict().items()}
    assert engine.load_weights(sd) == 1
    after = asyncio.run(engine.generate(p, s))
    assert after.policy_version == 1 and before.policy_version == 0
    assert after.versions == [1] * len(after.token_ids)
    assert after.logprobs != before.logprobs
