"""The local engine: continuous batching and prefix reuse give model.generate's greedy ids and
the trainer's logprobs; seeds reproduce; stops, context limits, weight updates, memory bounds
and aborts behave as documented."""

import asyncio
import copy

import pytest
import torch

from agentrl.errors import EngineError
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.train.actor import token_logprobs


def _engine(model, tok, **kw):
    return LocalEngine(model, eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id, tokenizer=tok, **kw)


def _prompts(tok):
    texts = ["P _ _ _", "user\n_ O _ O\n_ _ _ O", "What is 12 + 7?", "Left Right Up Down Left Right"]
    return [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                    return_dict=False) for t in texts]


def _next_turn(tok, prompt, reply, text="Now go on."):
    """The next prompt of a chat: history, the reply, a user message and the assistant header."""
    rest = tok.encode(f"\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    return prompt + reply + rest


def _greedy_ref(model, tok, prompt, n):
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=n, do_sample=False, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
    return out[: out.index(tok.eos_token_id) + 1] if tok.eos_token_id in out else out


def _recomputed(model, ids, temperature=1.0):
    ids = torch.tensor([ids])
    with torch.no_grad():
        return token_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)[0]


async def _gather(engine, prompts, params):
    return await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params)))


GREEDY = SamplingParams(greedy=True, max_new_tokens=12)


# ---------------------------------------------------------------------------- batching and reuse
def test_greedy_matches_model_generate_in_one_batch(tiny_model, tiny_tokenizer):
    engine = _engine(tiny_model, tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer)
    outs = asyncio.run(_gather(engine, prompts, [GREEDY] * len(prompts)))
    assert engine.stats.prefill_passes == 1  # all four joined at the first step
    for p, out in zip(prompts, outs):
        assert out.token_ids == _greedy_ref(tiny_model, tiny_tokenizer, p, 12)
        assert out.finish_reason == ("stop" if out.token_ids[-1] == tiny_tokenizer.eos_token_id else "length")
        assert len(out.logprobs) == len(out.token_ids) == len(out.versions)


def test_requests_join_the_running_batch(tiny_model, tiny_tokenizer):
    """B and C arrive while A is decoding: they join at the next step and share its decode passes."""
    engine = _engine(tiny_model, tiny_tokenizer)
    pa, pb, pc = _prompts(tiny_tokenizer)[:3]

    async def scenario():
        a = asyncio.ensure_future(engine.generate(pa, GREEDY))
        for _ in range(4):
            await asyncio.sleep(0)
        running = engine.sched.active[0].request
        assert not a.done() and 0 < len(running.out) < 12  # A is mid-decode
        rest = await asyncio.gather(engine.generate(pb, GREEDY), engine.generate(pc, GREEDY))
        return [await a, *rest]

    outs = asyncio.run(scenario())
    for p, out in zip((pa, pb, pc), outs):
        assert out.token_ids == _greedy_ref(tiny_model, tiny_tokenizer, p, 12)
    assert engine.stats.peak_running == 3
    assert engine.stats.decode_rows > engine.stats.decode_passes  # some passes decoded several rows


def test_next_turn_prefills_only_the_new_ids(tiny_model, tiny_tokenizer):
    engine = _engine(tiny_model, tiny_tokenizer)
    p1 = _prompts(tiny_tokenizer)[0]
    first = asyncio.run(engine.generate(p1, GREEDY))
    p2 = _next_turn(tiny_tokenizer, p1, first.token_ids)
    engine.stats.pop()
    second = asyncio.run(engine.generate(p2, GREEDY))
    seen = len(p1) + len(first.token_ids) - 1  # the last generated id was never run through the model
    assert engine.stats.prefill_tokens == len(p2) - seen
    assert engine.stats.cached_prompt_tokens == seen
    assert second.token_ids == _greedy_ref(tiny_model, tiny_tokenizer, p2, 12)


def test_group_samples_share_the_prompt_prefill(tiny_model, tiny_tokenizer):
    """n samples of one prompt: the prompt is prefilled once; each sample equals its run alone."""
    p = _prompts(tiny_tokenizer)[1]
    params = [SamplingParams(max_new_tokens=8, seed=k) for k in range(4)]
    engine = _engine(tiny_model, tiny_tokenizer)
    outs = asyncio.run(_gather(engine, [p] * 4, params))
    assert engine.stats.prefill_tokens == len(p)  # one prefill; the other samples share its logits
    for s, out in zip(params, outs):
        alone = asyncio.run(_engine(tiny_model, tiny_tokenizer).generate(p, s))
        assert out.token_ids == alone.token_ids
        assert out.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    assert len({tuple(o.token_ids) for o in outs}) > 1


def test_without_prefix_caching_every_prompt_is_prefilled(tiny_model, tiny_tokenizer):
    engine = _engine(tiny_model, tiny_tokenizer, enable_prefix_caching=False)
    p = _prompts(tiny_tokenizer)[1]
    outs = asyncio.run(_gather(engine, [p, p], [GREEDY, GREEDY]))
    first = outs[0]
    second = asyncio.run(engine.generate(_next_turn(tiny_tokenizer, p, first.token_ids), GREEDY))
    assert engine.stats.cached_prompt_tokens == 0 and not engine.sched.parked
    assert engine.stats.prefill_tokens == 2 * len(p) + len(_next_turn(tiny_tokenizer, p, first.token_ids))
    assert outs[1].token_ids == first.token_ids == _greedy_ref(tiny_model, tiny_tokenizer, p, 12)
    assert second.token_ids == _greedy_ref(tiny_model, tiny_tokenizer, _next_turn(tiny_tokenizer, p, first.token_ids), 12)


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


def test_engine_logprobs_equal_trainer_recomputation_across_turns(tiny_model, tiny_tokenizer):
    """fp32: logprobs of ids generated from a cached prefix equal a full forward's to 1e-5."""
    engine = _engine(tiny_model, tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer)
    params = [SamplingParams(temperature=0.7, max_new_tokens=10, seed=k) for k in range(len(prompts))]
    firsts = asyncio.run(_gather(engine, prompts, params))
    seconds_prompts = [_next_turn(tiny_tokenizer, p, o.token_ids) for p, o in zip(prompts, firsts)]
    seconds = asyncio.run(_gather(engine, seconds_prompts, params))
    assert engine.stats.cached_prompt_tokens > 0
    for p, o in zip(seconds_prompts + prompts, seconds + firsts):
        lp = _recomputed(tiny_model, p + o.token_ids, temperature=0.7)[len(p):]
        assert torch.allclose(lp, torch.tensor(o.logprobs), atol=1e-5)


def test_top_k_one_is_greedy(tiny_model, tiny_tokenizer):
    p = _prompts(tiny_tokenizer)[1]
    greedy = asyncio.run(_engine(tiny_model, tiny_tokenizer).generate(p, SamplingParams(greedy=True, max_new_tokens=8)))
    topk = asyncio.run(_engine(tiny_model, tiny_tokenizer).generate(p, SamplingParams(top_k=1, max_new_tokens=8, seed=5)))
    assert topk.token_ids == greedy.token_ids


# ---------------------------------------------------------------------------- stops and limits
def test_stop_ids_end_generation_exactly(tiny_model, tiny_tokenizer):
    p = _prompts(tiny_tokenizer)[0]
    out = asyncio.run(_engine(tiny_model, tiny_tokenizer).generate(p, SamplingParams(max_new_tokens=3, seed=1)))
    assert len(out.token_ids) <= 3
    assert out.finish_reason == ("stop" if tiny_tokenizer.eos_token_id in out.token_ids else "length")
    first = out.token_ids[1]
    stopped = asyncio.run(_engine(tiny_model, tiny_tokenizer).generate(
        p, SamplingParams(max_new_tokens=3, seed=1, stop_token_ids=(first,))))
    assert stopped.token_ids == out.token_ids[: out.token_ids.index(first) + 1]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == first


def test_stop_strings_end_generation_exactly(tiny_model, tiny_tokenizer):
    tok = tiny_tokenizer
    p = _prompts(tok)[2]
    free = asyncio.run(_engine(tiny_model, tok).generate(p, SamplingParams(max_new_tokens=16, seed=3)))
    texts = [tok.decode(free.token_ids[: k + 1]) for k in range(len(free.token_ids))]
    k = next(k for k in range(3, len(texts)) if len(texts[k]) >= len(texts[k - 1]) + 1 and len(texts[k]) >= 3)
    stop = texts[k][-3:]  # ends inside id k, so generation must end exactly there
    first = next(i for i, t in enumerate(texts) if stop in t)
    out = asyncio.run(_engine(tiny_model, tok).generate(p, SamplingParams(max_new_tokens=16, seed=3, stop=(stop,))))
    assert out.token_ids == free.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert stop in tok.decode(out.token_ids) and stop not in tok.decode(out.token_ids[:-1])


def test_over_the_context_limit_is_an_error_or_a_length_finish(tiny_model, tiny_tokenizer):
    engine = _engine(tiny_model, tiny_tokenizer, max_model_len=32)
    with pytest.raises(EngineError, match="leaves no room.*max_model_len is 32"):
        asyncio.run(engine.generate(list(range(5, 37)), SamplingParams(max_new_tokens=8)))
    out = asyncio.run(engine.generate(list(range(5, 33)), SamplingParams(max_new_tokens=8, seed=0)))
    assert len(out.token_ids) <= 4
    assert out.finish_reason == ("stop" if out.token_ids[-1] == tiny_tokenizer.eos_token_id else "length")
    with pytest.raises(EngineError, match="outside the model's vocabulary"):
        asyncio.run(engine.generate([5, 10**6], SamplingParams()))


# ---------------------------------------------------------------------------- weight updates
def _perturbed(model, scale=0.05):
    g = torch.Generator().manual_seed(7)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def test_after_a_weight_update_the_next_request_uses_the_new_weights(tiny_model, tiny_tokenizer):
    engine = _engine(copy.deepcopy(tiny_model), tiny_tokenizer)
    p = _prompts(tiny_tokenizer)[2]
    before = asyncio.run(engine.generate(p, GREEDY))
    new = copy.deepcopy(tiny_model)
    new.load_state_dict(_perturbed(tiny_model))
    assert engine.load_weights(new.state_dict()) == 1
    after = asyncio.run(engine.generate(p, GREEDY))
    assert before.policy_version == 0 and after.policy_version == 1
    assert after.versions == [1] * len(after.token_ids) and after.kv_version == 1
    lp = _recomputed(new, p + after.token_ids)[len(p):]
    assert torch.allclose(lp, torch.tensor(after.logprobs), atol=1e-5)


@pytest.mark.parametrize("mode", ["recompute", "keep"])
def test_weight_update_between_decode_steps(tiny_model, tiny_tokenizer, mode):
    """An update lands between two steps: later ids carry the new version; with recompute their
    logprobs are the new policy's over the whole sequence, with keep the old KV is reported."""
    engine = _engine(copy.deepcopy(tiny_model), tiny_tokenizer, kv_on_weight_update=mode)
    new = copy.deepcopy(tiny_model)
    new.load_state_dict(_perturbed(tiny_model, 0.2))
    p = _prompts(tiny_tokenizer)[3]
    s = SamplingParams(max_new_tokens=12, seed=11)

    async def scenario():
        task = asyncio.ensure_future(engine.generate(p, s))
        for _ in range(5):
            await asyncio.sleep(0)
        engine.load_weights(new.state_dict())
        return await task

    out = asyncio.run(scenario())
    k = out.versions.index(1)
    assert 0 < k and out.versions == [0] * k + [1] * (len(out.token_ids) - k)
    old_lp = _recomputed(tiny_model, p + out.token_ids)[len(p):]
    new_lp = _recomputed(new, p + out.token_ids)[len(p):]
    got = torch.tensor(out.logprobs)
    assert torch.allclose(got[:k], old_lp[:k], atol=1e-5)
    if mode == "recompute":
        assert out.kv_version == 1
        assert torch.allclose(got[k:], new_lp[k:], atol=1e-5)
    else:
        assert out.kv_version == 0
        assert not torch.allclose(got[k:], new_lp[k:], atol=1e-3)  # it attended to stale KV


def test_recompute_drops_prefix_caches_and_keep_reuses_them(tiny_model, tiny_tokenizer):
    p1 = _prompts(tiny_tokenizer)[0]
    for mode, reused in (("recompute", False), ("keep", True)):
        engine = _engine(copy.deepcopy(tiny_model), tiny_tokenizer, kv_on_weight_update=mode)
        first = asyncio.run(engine.generate(p1, GREEDY))
        engine.load_weights(_perturbed(tiny_model))
        engine.stats.pop()
        second = asyncio.run(engine.generate(_next_turn(tiny_tokenizer, p1, first.token_ids), GREEDY))
        assert (engine.stats.cached_prompt_tokens > 0) == reused
        assert second.kv_version == (0 if reused else 1)


# ---------------------------------------------------------------------------- memory bounds
def test_memory_bounds_queue_requests_instead_of_failing(tiny_model, tiny_tokenizer):
    prompts = _prompts(tiny_tokenizer)
    params = [SamplingParams(max_new_tokens=10, seed=k) for k in range(len(prompts))]
    free = asyncio.run(_gather(_engine(tiny_model, tiny_tokenizer), prompts, params))
    by_seqs = _engine(tiny_model, tiny_tokenizer, max_num_seqs=2)
    assert [o.token_ids for o in asyncio.run(_gather(by_seqs, prompts, params))] == [o.token_ids for o in free]
    assert by_seqs.stats.peak_running == 2
    budget = max(len(p) for p in prompts) + 10 + 5  # room for one request at a time
    by_tokens = _engine(tiny_model, tiny_tokenizer, max_total_tokens=budget)
    assert [o.token_ids for o in asyncio.run(_gather(by_tokens, prompts, params))] == [o.token_ids for o in free]
    assert by_tokens.stats.peak_running == 1 and by_tokens.stats.peak_kv_tokens <= budget
    assert by_tokens.sched.evictions >= len(prompts) - 1  # parked caches made room


def test_a_request_that_can_never_fit_fails_clearly(tiny_model, tiny_tokenizer):
    engine = _engine(tiny_model, tiny_tokenizer, max_total_tokens=16)
    with pytest.raises(EngineError, match="can never fit.*engine.max_total_tokens"):
        asyncio.run(engine.generate(_prompts(tiny_tokenizer)[0], SamplingParams(max_new_tokens=8)))
    out = asyncio.run(engine.generate([5, 6, 7], SamplingParams(max_new_tokens=4, seed=0)))
    assert 1 <= len(out.token_ids) <= 4  # the engine still serves what fits


def test_chunked_prefill_gives_the_same_ids(tiny_model, tiny_tokenizer):
    prompts = _prompts(tiny_tokenizer)
    chunked = _engine(tiny_model, tiny_tokenizer, max_num_batched_tokens=7)
    outs = asyncio.run(_gather(chunked, prompts, [GREEDY] * len(prompts)))
    assert chunked.stats.prefill_passes > len(prompts)
    for p, out in zip(prompts, outs):
        assert out.token_ids == _greedy_ref(tiny_model, tiny_tokenizer, p, 12)


# ---------------------------------------------------------------------------- abort and cancel
def test_abort_finishes_requests_with_their_partial_ids(tiny_model, tiny_tokenizer):
    engine = _engine(tiny_model, tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer)[:3]
    long = SamplingParams(max_new_tokens=200, seed=0, stop_token_ids=(), greedy=False)

    async def scenario():
        tasks = [asyncio.ensure_future(engine.generate(p, long)) for p in prompts]
        for _ in range(4):
            await asyncio.sleep(0)
        engine.abort()
        return await asyncio.gather(*tasks)

    engine.eos_token_ids = frozenset()  # nothing ends these requests but the abort
    outs = asyncio.run(scenario())
    assert all(o.finish_reason == "abort" and 0 < len(o.token_ids) < 200 for o in outs)
    assert all(len(o.logprobs) == len(o.token_ids) for o in outs)
    again = asyncio.run(engine.generate(prompts[0], SamplingParams(max_new_tokens=3, seed=0)))
    assert again.finish_reason == "length" and len(again.token_ids) == 3


def test_a_cancelled_caller_does_not_stop_the_others(tiny_model, tiny_tokenizer):
    engine = _engine(tiny_model, tiny_tokenizer)
    pa, pb = _prompts(tiny_tokenizer)[:2]

    async def scenario():
        a = asyncio.ensure_future(engine.generate(pa, SamplingParams(max_new_tokens=12, seed=0)))
        b = asyncio.ensure_future(engine.generate(pb, GREEDY))
        for _ in range(3):
            await asyncio.sleep(0)
        a.cancel()
        return await b

    out = asyncio.run(scenario())
    assert out.token_ids == _greedy_ref(tiny_model, tiny_tokenizer, pb, 12)
    assert not engine.sched.active and not engine.sched.waiting


def test_state_dict_round_trip(tiny_model, tiny_tokenizer):
    engine = _engine(tiny_model, tiny_tokenizer, seed=3)
    engine.load_weights(tiny_model.state_dict())
    state = engine.state_dict()
    p = _prompts(tiny_tokenizer)[0]
    a = asyncio.run(engine.generate(p, SamplingParams(max_new_tokens=6)))  # seed drawn from the engine
    other = _engine(tiny_model, tiny_tokenizer)
    other.load_state_dict(state)
    b = asyncio.run(other.generate(p, SamplingParams(max_new_tokens=6)))
    assert other.policy_version == 1 and a.token_ids == b.token_ids


def test_reset_prefix_cache_leaves_the_engine_as_a_new_one(tiny_model, tiny_tokenizer):
    """What follows a reset (after an evaluation, at a checkpoint) is served exactly as by a new
    engine: nothing from the cache, the same passes, rows and cache shape."""
    prompts = _prompts(tiny_tokenizer)
    params = [SamplingParams(max_new_tokens=8, seed=i) for i in range(len(prompts))]
    used = _engine(tiny_model, tiny_tokenizer, kv_on_weight_update="keep")
    asyncio.run(_gather(used, prompts, [GREEDY] * len(prompts)))  # parks every prompt and reply
    used.load_weights(tiny_model.state_dict())  # keep: the parked prefixes survive the update
    assert used.sched.parked
    assert used.reset_prefix_cache()
    assert not used.sched.parked and used.cache.rows == 0 and used.cache.capacity == 0
    used.stats.pop()
    fresh = _engine(tiny_model, tiny_tokenizer)
    a = asyncio.run(_gather(used, prompts, params))
    b = asyncio.run(_gather(fresh, prompts, params))
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.logprobs for o in a] == [o.logprobs for o in b]
    assert used.stats.pop() | {"perf/engine_tokens_per_s": 0} == fresh.stats.pop() | {"perf/engine_tokens_per_s": 0}


def test_reset_prefix_cache_is_refused_while_requests_run(tiny_model, tiny_tokenizer):
    engine = _engine(tiny_model, tiny_tokenizer)
    p = _prompts(tiny_tokenizer)[0]

    async def scenario():
        task = asyncio.ensure_future(engine.generate(p, SamplingParams(max_new_tokens=6, seed=0)))
        await asyncio.sleep(0)
        refused = not engine.reset_prefix_cache()
        return refused, await task

    refused, out = asyncio.run(scenario())
    assert refused and out.token_ids  # the running request was not disturbed


# ---------------------------------------------------------------------------- the engine contract
def test_the_local_engine_is_an_inference_engine_the_run_can_drive(tiny_model, tiny_tokenizer):
    from agentrl.llm.engine import InferenceEngine

    engine = _engine(copy.deepcopy(tiny_model), tiny_tokenizer)
    assert isinstance(engine, InferenceEngine)
    prompt = _prompts(tiny_tokenizer)[0]
    asyncio.run(engine.generate(prompt, GREEDY))
    metrics = engine.pop_metrics()
    assert metrics["perf/engine_requests"] == 1.0 and metrics["perf/engine_generated_tokens"] >= 1.0
    assert engine.pop_metrics()["perf/engine_requests"] == 0.0  # popped: the counters restart
    state = engine.state_dict()
    assert engine.load_weights(tiny_model.state_dict()) == 1 == engine.policy_version
    engine.load_state_dict(state)
    assert engine.policy_version == 0
    engine.close()
    assert not engine.sched.parked
    with pytest.raises(EngineError, match="closed"):
        asyncio.run(engine.generate(prompt, GREEDY))
