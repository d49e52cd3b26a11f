"""The engine's fixed-shape decode pass (what CUDA graphs replay): padded batch sizes, the scratch
row and the full-capacity mask give the eager pass's ids and logprobs, and leave every sequence's
cached keys/values as they were. On CPU the pass runs eagerly; with CUDA it is captured."""

import asyncio

import pytest
import torch

from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.decode_graphs import DecodeGraphs, bucket
from agentrl.llm.local.engine import LocalEngine
from agentrl.train.actor import token_logprobs


def _engine(model, tok, fixed_shapes: bool, capture: bool = False):
    engine = LocalEngine(model, eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id, tokenizer=tok,
                         enforce_eager=True)
    if fixed_shapes:
        engine.graphs = DecodeGraphs(engine, capture=capture)
    return engine


def _chat(tok, text):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False)


def _play(engine, tok):
    """Five episodes of two turns (bucket 8: three padding rows), the second turn from the parked
    KV of the first, two of them sampled from one shared prompt, one joining mid-decode."""
    texts = ["P _ _ _", "_ O _ O\n_ _ _ O", "What is 12 + 7?", "Left Right Up Down", "P _ _ _"]
    params = [SamplingParams(temperature=0.8, max_new_tokens=9, seed=k) for k in range(len(texts))]

    async def episode(i):
        if i == 4:
            for _ in range(3):
                await asyncio.sleep(0)
        prompt = _chat(tok, texts[i])
        first = await engine.generate(prompt, params[i])
        rest = tok.encode("\n<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        second_prompt = prompt + first.token_ids + rest
        second = await engine.generate(second_prompt, params[i])
        return second_prompt, first, second

    async def run():
        return await asyncio.gather(*(episode(i) for i in range(len(texts))))

    return asyncio.run(run())


def test_buckets_pad_to_powers_of_two_then_multiples_of_eight():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 64, 65)] == [1, 2, 4, 4, 8, 8, 16, 16, 24, 64, 72]


def test_fixed_shape_decode_gives_the_eager_ids_and_logprobs(tiny_model, tiny_tokenizer):
    eager = _play(_engine(tiny_model, tiny_tokenizer, fixed_shapes=False), tiny_tokenizer)
    engine = _engine(tiny_model, tiny_tokenizer, fixed_shapes=True)
    fixed = _play(engine, tiny_tokenizer)
    assert engine.stats.cached_prompt_tokens > 0 and engine.stats.decode_passes > 0
    for (prompt, f1, f2), (_, e1, e2) in zip(fixed, eager):
        assert f1.token_ids == e1.token_ids and f2.token_ids == e2.token_ids
        assert f1.logprobs == pytest.approx(e1.logprobs, abs=1e-5)
        assert f2.logprobs == pytest.approx(e2.logprobs, abs=1e-5)
        # The second turn decoded from KV parked beside padding rows' writes: still the model's own.
        ids = torch.tensor([prompt + f2.token_ids])
        with torch.no_grad():
            full = token_logprobs(tiny_model, ids, torch.ones_like(ids), temperature=0.8)[0][len(prompt):]
        assert torch.allclose(full, torch.tensor(f2.logprobs), atol=1e-5)


def test_the_scratch_row_belongs_to_no_sequence(tiny_model, tiny_tokenizer):
    engine = _engine(tiny_model, tiny_tokenizer, fixed_shapes=True)
    _play(engine, tiny_tokenizer)
    assert engine.cache.rows - 1 >= len(engine.sched.rows)  # the last physical row is the scratch
    assert engine.cache.rows >= bucket(5) + 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_captured_graphs_give_the_eager_ids_on_cuda(tiny_model, tiny_tokenizer):
    model = tiny_model.to("cuda")
    try:
        eager = _play(_engine(model, tiny_tokenizer, fixed_shapes=False), tiny_tokenizer)
        tok = tiny_tokenizer
        engine = LocalEngine(model, eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id,
                             tokenizer=tok)  # on CUDA the engine captures by default
        graphed = _play(engine, tiny_tokenizer)
        assert engine.graphs is not None and engine.graphs.captures > 0
        for (_, g1, g2), (_, e1, e2) in zip(graphed, eager):
            assert g1.token_ids == e1.token_ids and g2.token_ids == e2.token_ids
            assert g2.logprobs == pytest.approx(e2.logprobs, abs=1e-4)
    finally:
        tiny_model.to("cpu")
