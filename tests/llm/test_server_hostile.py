"""Malformed and hostile requests: each is answered with a 4xx JSON error naming the problem,
and the server keeps serving (a valid request after all of them is answered)."""

import copy
import json
import socket

import httpx
import pytest
from helpers import nodelay_client

from agentrl.config.serve import ServeConfig
from agentrl.llm.local.engine import LocalEngine
from agentrl.llm.server.app import start_server

KEY = "k"
H = {"Authorization": f"Bearer {KEY}"}
JSON_BODY = {"content-type": "application/json"}  # the type every POST route takes (415 otherwise: guard.py)
OK_MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tiny_model, tiny_tokenizer):
    engine = LocalEngine(copy.deepcopy(tiny_model), eos_token_ids=(tiny_tokenizer.eos_token_id,),
                         pad_token_id=tiny_tokenizer.pad_token_id, tokenizer=tiny_tokenizer, max_model_len=256)
    handle = start_server(engine, tiny_tokenizer, ServeConfig(port=0, api_key=KEY, max_tokens=32, max_n=4))
    yield handle
    handle.stop()


# Values of the wrong type, out of range or absurd, per field of a chat request.
BAD_FIELDS = {
    "model": [1, True, [], {}],
    "messages": ["hi", [], {}, 3, None, [1], [None], [{}], [{"role": "bogus", "content": "x"}],
                [{"role": "user", "content": 5}], [{"role": "user", "content": [{"type": "image_url"}]}],
                [{"role": "user", "content": [{"type": "text"}]}], [{"role": 3, "content": "x"}],
                [{"role": "assistant", "content": "x", "tool_calls": "call"}],
                [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}],
                [{"role": "tool", "content": "x", "tool_call_id": 7}], [{"role": "user", "content": {"a": 1}}]],
    "max_tokens": [0, -1, 10**9, 2**63, 2**70, "10", 1.5, True, [], float("1e308")],
    "max_completion_tokens": [0, 10**9, "x"],
    "temperature": [-1, "hot", True, 1000, [], float("nan"), float("inf")],
    "top_p": [0, -0.5, 1.5, "x", False],
    "top_k": [-5, "x", 1.5],
    "n": [0, -1, 5, 10**6, 2**64, "2", 1.0, True],
    "stop": [1, [1], [""], ["x" * 300], ["s"] * 20, {"a": 1}, True],
    "seed": ["x", 1.5, 2**64, -(2**64), True],
    "stream": ["yes", 1, []],
    "logprobs": ["yes", 2, []],
    "top_logprobs": [-1, 21, "x", 2.5],
    "tools": ["x", [1], [{"type": "function"}], [{"function": {"name": 3}}], {}],
    "presence_penalty": [1.0, "x"],
    "frequency_penalty": [0.5],
    "logit_bias": [{"5": 100}, "x"],
    "response_format": [{"type": "json_object"}, "json"],
    "return_token_ids": ["yes", 1],
}


COMPLETION_FIELDS = ("model", "max_tokens", "temperature", "top_p", "top_k", "n", "stop", "seed", "stream",
                     "presence_penalty", "frequency_penalty", "logit_bias", "return_token_ids")


def _hostile() -> list[tuple[str, str, dict]]:
    """(method, path, httpx kwargs) of every hostile request."""
    out = []
    for name, values in BAD_FIELDS.items():
        for v in values:
            body = {"model": "agentrl", "messages": OK_MESSAGES, "max_tokens": 4, name: v}
            out.append(("POST", "/v1/chat/completions", {"content": json.dumps(body)}))
            if name in COMPLETION_FIELDS:
                body = {"model": "agentrl", "prompt": "hi", "max_tokens": 4, name: v}
                out.append(("POST", "/v1/completions", {"content": json.dumps(body)}))
    for raw in ["", "{", "[1,2", "nan", "null", "[]", '"text"', "1", "{'a': 1}", '{"messages": [}', "\x00\x01",
                "[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000]:
        out.append(("POST", "/v1/chat/completions", {"content": raw.encode()}))
    out.append(("POST", "/v1/chat/completions", {"content": b"\xff\xfe\xfa invalid utf-8"}))
    huge = json.dumps({"model": "agentrl", "messages": [{"role": "user", "content": "x" * 10_000_000}]})
    out.append(("POST", "/v1/chat/completions", {"content": huge}))  # 10 MB: 413
    out.append(("POST", "/v1/chat/completions", {"content": json.dumps({"model": "gpt-5", "messages": OK_MESSAGES})}))
    completions = [{"prompt": ""}, {"prompt": []}, {"prompt": [[]]}, {"prompt": [10**6]}, {"prompt": [-3]},
                   {"prompt": 5}, {"prompt": [1.5]}, {"prompt": ["a"] * 50}, {"prompt": "x", "echo": True},
                   {"prompt": "x", "best_of": 3}, {"prompt": "x", "suffix": "y"}, {"prompt": "x", "logprobs": 30},
                   {"prompt": "x", "max_tokens": 10**6}, {"prompt": "x", "n": 9}, {}, {"prompt": [5] * 300}]
    for body in completions:
        out.append(("POST", "/v1/completions", {"content": json.dumps({"model": "agentrl", **body})}))
    vllm = [{}, {"token_ids": []}, {"token_ids": "abc"}, {"token_ids": [1e9]}, {"token_ids": [10**7]},
            {"token_ids": [-1]}, {"token_ids": [5] * 400}, {"token_ids": [5], "sampling_params": {"max_tokens": 10**5}},
            {"token_ids": [5], "sampling_params": {"n": 2}}, {"token_ids": [5], "sampling_params": {"temperature": -1}},
            {"token_ids": [5], "sampling_params": "greedy"}, {"token_ids": [5], "stream": True},
            {"token_ids": [5], "model": "other"}, {"token_ids": [5], "sampling_params": {"top_p": 0}}]
    for body in vllm:
        out.append(("POST", "/inference/v1/generate", {"content": json.dumps(body)}))
    ours = [{}, {"prompt_ids": []}, {"prompt_ids": [5], "sampling": {"temperature": 0}},
            {"prompt_ids": [5], "sampling": {"max_new_tokens": 0}}, {"prompt_ids": [5], "sampling": {"seed": -1}},
            {"prompt_ids": [5], "sampling": {"stop": "x"}}, {"prompt_ids": [99999]}]
    for body in ours:
        out.append(("POST", "/agentrl/generate", {"content": json.dumps(body)}))
    weights = [("/agentrl/weights", {"content": b"not safetensors", "params": {"version": "1"}}),
               ("/agentrl/weights", {"content": b"\x00" * 64}),
               ("/agentrl/weights", {"content": b"x", "params": {"version": "-1"}}),
               ("/agentrl/weights", {"json": {"path": "/nonexistent/w.safetensors", "version": 1}}),
               ("/agentrl/weights", {"json": {"path": 3, "version": 1}}),
               ("/agentrl/weights", {"json": {"version": 1}}),
               ("/agentrl/state", {"json": {"policy_version": -1}}), ("/agentrl/state", {"json": {}}),
               ("/sessions/nope/reward", {"json": {"reward": 1.0}}),
               ("/sessions/nope/v1/chat/completions", {"json": {"messages": OK_MESSAGES}})]
    for path, kw in weights:
        out.append(("POST", path, kw))
    valid = json.dumps({"model": "agentrl", "messages": OK_MESSAGES, "max_tokens": 4})
    for headers in ({"host": "evil.example"}, {"host": "evil.example:80"}, {"origin": "http://evil.example"},
                    {"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"}):
        for path in ("/v1/chat/completions", "/sessions"):  # a page re-pointed at us, or another type
            out.append(("POST", path, {"content": valid, "headers": headers}))
    for method, path in [("GET", "/v1/nothing"), ("GET", "/v1/chat/completions"), ("PUT", "/v1/models"),
                         ("DELETE", "/sessions/nope"), ("GET", "/sessions/nope"), ("GET", "/../../etc/passwd"),
                         ("POST", "/sessions/nope/v1/completions"), ("PATCH", "/health")]:
        out.append((method, path, {}))
    return out


def test_every_hostile_request_gets_a_4xx_and_the_server_keeps_serving(server):
    requests = _hostile()
    statuses = []
    with nodelay_client(base_url=server.url, headers={**H, **JSON_BODY}, timeout=60) as c:
        sid = c.post("/sessions").json()["id"]  # a session's chat route meets the same requests
        requests += [(m, f"/sessions/{sid}/v1/chat/completions", kw) for m, p, kw in requests
                     if p == "/v1/chat/completions" and "gpt-5" not in str(kw) and '"model": 1' not in str(kw)]
        assert len(requests) >= 200
        for method, path, kw in requests:
            r = c.request(method, path, **kw)
            statuses.append(r.status_code)
            assert 400 <= r.status_code < 500, (method, path, str(kw)[:200], r.status_code, r.text[:300])
            if r.headers.get("content-type", "").startswith("application/json"):
                err = r.json().get("error", r.json())
                assert err, r.text
        # A request the engine must refuse (prompt beyond the context) does not break the engine.
        r = c.post("/v1/completions", json={"model": "agentrl", "prompt": [5] * 300, "max_tokens": 2})
        assert r.status_code == 400 and "max_model_len" in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json={"model": "agentrl", "messages": OK_MESSAGES, "max_tokens": 4})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    assert 413 in statuses and 404 in statuses and 405 in statuses


def test_errors_name_the_field(server):
    with nodelay_client(base_url=server.url, headers=H) as c:
        r = c.post("/v1/chat/completions", json={"model": "agentrl", "messages": OK_MESSAGES, "max_tokens": "ten"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        r = c.post("/v1/chat/completions", json={"model": "agentrl", "messages": OK_MESSAGES, "max_tokens": 999})
        assert "serve.max_tokens" in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json={"model": "agentrl", "messages": [{"role": "robot", "content": "x"}]})
        assert r.json()["error"]["param"] == "messages[0].role"


def test_raw_protocol_garbage_is_refused(server):
    host, port = server.url.removeprefix("http://").split(":")
    for junk in (b"GARBAGE\r\n\r\n", b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
                 b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 100_000 + b"\r\n\r\n"):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(junk)
            reply = s.recv(200)
        assert reply.startswith(b"HTTP/1.1 4"), reply
    assert httpx.get(server.url + "/health").status_code == 200
