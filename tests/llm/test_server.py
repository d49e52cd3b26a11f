"""The policy server with the real `openai` client over loopback: chat and text completions
with logprobs and token ids, n > 1, seeds, stop strings, SSE streaming, vLLM's token route,
the API key, the served model id. One server (tiny model, in-process) serves the module."""

import asyncio
import copy

import httpx
import openai
import pytest
from helpers import nodelay_client

from agentrl.config.serve import ServeConfig
from agentrl.llm.engine import SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.llm.server.app import start_server

KEY = "test-key"


def _engine(model, tok):
    return LocalEngine(copy.deepcopy(model), eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id,
                       tokenizer=tok)


@pytest.fixture(scope="module")
def server(tiny_model, tiny_tokenizer):
    handle = start_server(_engine(tiny_model, tiny_tokenizer), tiny_tokenizer,
                          ServeConfig(port=0, api_key=KEY, max_tokens=64))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, http_client=nodelay_client())


MESSAGES = [{"role": "user", "content": "FrozenLake. Move P to G, avoid holes O."}]


def _chat(client, **kw):
    args = dict(model="agentrl", messages=MESSAGES, max_tokens=12, seed=7, extra_body={"return_token_ids": True})
    return client.chat.completions.create(**{**args, **kw})


def test_chat_returns_token_ids_logprobs_and_versions(client, tiny_model, tiny_tokenizer):
    tok = tiny_tokenizer
    r = _chat(client, logprobs=True, top_logprobs=3)
    choice = r.choices[0]
    ids = choice.token_ids
    expected_prompt = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    assert r.prompt_token_ids == expected_prompt
    assert 1 <= len(ids) <= 12 and r.usage.completion_tokens == len(ids)
    assert r.usage.prompt_tokens == len(expected_prompt)
    body = ids[:-1] if ids[-1] == tok.eos_token_id else ids
    assert choice.message.content == tok.decode(body, skip_special_tokens=True)
    assert [t.logprob for t in choice.logprobs.content] and len(choice.logprobs.content) == len(ids)
    assert all(len(t.top_logprobs) == 3 for t in choice.logprobs.content)
    assert choice.policy_versions == [0] * len(ids) and r.policy_version == 0
    # The engine in this process, same prompt and seed: the same ids and logprobs.
    engine = _engine(tiny_model, tok)
    sp = SamplingParams(max_new_tokens=12, seed=7, stop_token_ids=(tok.eos_token_id,))
    mine = asyncio.run(engine.generate(expected_prompt, sp))
    assert mine.token_ids == ids
    assert [t.logprob for t in choice.logprobs.content] == pytest.approx(mine.logprobs, abs=1e-6)


def test_n_choices_are_seeded_and_reproducible(client):
    a = _chat(client, n=3, max_tokens=10)
    b = _chat(client, n=3, max_tokens=10)
    assert [c.token_ids for c in a.choices] == [c.token_ids for c in b.choices]
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in a.choices}) == 3  # seed + i per choice: three samples
    greedy = [_chat(client, temperature=0, max_tokens=10).choices[0].token_ids for _ in range(2)]
    assert greedy[0] == greedy[1]


def test_stop_string_ends_the_reply_and_is_left_out(client, tiny_tokenizer):
    free = _chat(client, max_tokens=40, seed=11)
    ids = free.choices[0].token_ids
    pieces = [tiny_tokenizer.decode([t]) for t in ids]
    k = next(i for i, p in enumerate(pieces[2:], 2) if len(p) >= 2 and p.isascii() and p.strip().isalnum())
    text = free.choices[0].message.content
    stop = pieces[k]
    r = _chat(client, max_tokens=40, seed=11, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[:text.index(stop)]
    assert r.choices[0].token_ids == ids[:len(r.choices[0].token_ids)]  # the same sample, cut at the stop


def test_streaming_sends_the_same_reply_as_events(client):
    whole = _chat(client, max_tokens=16, seed=3)
    stream = _chat(client, max_tokens=16, seed=3, stream=True, stream_options={"include_usage": True})
    deltas, ids, finish, usage = [], [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            deltas.append(c.delta.content or "")
            ids += getattr(c, "token_ids", None) or []
            finish = c.finish_reason or finish
    assert "".join(deltas) == whole.choices[0].message.content
    assert ids == whole.choices[0].token_ids
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == len(ids)


def test_text_completions_from_text_and_token_ids(client, tiny_tokenizer):
    r = client.completions.create(model="agentrl", prompt="P _ _ _", max_tokens=6, seed=1, logprobs=2,
                                  extra_body={"return_token_ids": True})
    c = r.choices[0]
    assert c.prompt_token_ids == tiny_tokenizer.encode("P _ _ _", add_special_tokens=False)
    assert len(c.logprobs.tokens) == len(c.token_ids) == len(c.logprobs.token_logprobs)
    assert all(1 <= len(row) <= 2 for row in c.logprobs.top_logprobs)  # a dict: two ids may share a text
    again = client.completions.create(model="agentrl", prompt=c.prompt_token_ids, max_tokens=6, seed=1,
                                      extra_body={"return_token_ids": True})
    assert again.choices[0].token_ids == c.token_ids and again.choices[0].text == c.text
    two = client.completions.create(model="agentrl", prompt=["a b", "c d"], max_tokens=4, n=2, seed=1)
    assert [ch.index for ch in two.choices] == [0, 1, 2, 3]
    with pytest.raises(openai.BadRequestError, match="echo"):
        client.completions.create(model="agentrl", prompt="x", max_tokens=2, echo=True)


def test_vllm_token_route_matches_the_engine(server, tiny_model, tiny_tokenizer):
    prompt = tiny_tokenizer.encode("user\nP _ _ _", add_special_tokens=False)
    r = httpx.post(server.url + "/inference/v1/generate", headers={"Authorization": f"Bearer {KEY}"},
                   json={"token_ids": prompt, "sampling_params": {"max_tokens": 8, "seed": 5, "logprobs": 0}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    mine = asyncio.run(_engine(tiny_model, tiny_tokenizer).generate(prompt, SamplingParams(max_new_tokens=8, seed=5)))
    assert choice["token_ids"] == mine.token_ids
    assert [c["logprob"] for c in choice["logprobs"]["content"]] == pytest.approx(mine.logprobs, abs=1e-6)


def test_api_key_and_model_id(server, client):
    assert [m.id for m in client.models.list().data] == ["agentrl"]
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="agentrl", messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    assert httpx.post(server.url + "/v1/chat/completions", json={}).status_code == 401  # no key at all
    assert httpx.get(server.url + "/health").json()["status"] == "ok"  # open: readiness probes
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
