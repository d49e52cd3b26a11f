"""No local process or web page may replace the served model: from a client's side, against a
real server on loopback (in-process, tiny model) with the real `openai` and HTTP clients.

The control routes (weights, state, cache, metrics) take the admin key even when the server has
no serve.api_key, refuse browsers (an Origin header) and bodies of another Content-Type; the path
form of the weight route reads only inside serve.weights_dir and never says what exists outside;
a push that does not fit changes nothing, bit for bit; a body over its cap is refused with a 413
its client can read while still uploading; no malformed chat or completion body gets a 5xx; a
silent connection is closed; a host that is loopback only by its spelling needs a key."""

import copy
import json
import socket
import urllib.error
import urllib.request

import httpx
import openai
import pytest
import torch
from helpers import nodelay_client
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentrl.config.serve import ServeConfig
from agentrl.errors import EngineError
from agentrl.llm.local.engine import LocalEngine
from agentrl.llm.server.app import start_server
from agentrl.llm.weights import save_file_atomic, to_bytes

BINARY = {"content-type": "application/octet-stream"}
MESSAGES = [{"role": "user", "content": "FrozenLake. Move P to G, avoid holes O."}]


def _serve(model, tok, **cfg):
    engine = LocalEngine(copy.deepcopy(model), eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id,
                         tokenizer=tok, max_model_len=256)
    return engine, start_server(engine, tok, ServeConfig(port=0, max_tokens=16, max_n=2, **cfg))


@pytest.fixture
def served(tiny_model, tiny_tokenizer):
    """A server with no serve.api_key (the default): its engine and handle."""
    engine, handle = _serve(tiny_model, tiny_tokenizer)
    yield engine, handle
    handle.stop()


def _admin(handle):
    return {"Authorization": f"Bearer {handle.admin_key}"}


def _reply(handle):
    """A greedy reply's token ids, through the openai client (no key: the generation routes are open)."""
    client = openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0, http_client=nodelay_client())
    r = client.chat.completions.create(model="agentrl", messages=MESSAGES, max_tokens=8, temperature=0,
                                       extra_body={"return_token_ids": True})
    return r.choices[0].token_ids


def _bits(engine):
    """The served weights' exact bytes, by name."""
    return {k: v.detach().flatten().view(torch.uint8).clone() for k, v in engine.model.state_dict().items()}


def _same_bits(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _version(handle):
    return httpx.get(handle.url + "/health").json()["policy_version"]


def test_a_push_without_the_admin_key_is_refused_and_replies_stay_the_same(served):
    engine, handle = served
    reply, bits = _reply(handle), _bits(engine)
    zeros = to_bytes({k: torch.zeros_like(v) for k, v in engine.model.state_dict().items()})
    with nodelay_client(base_url=handle.url, timeout=60) as c:
        for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer"}, {"Authorization": "Basic x"}):
            r = c.post("/agentrl/weights", params={"version": 7}, content=zeros, headers={**BINARY, **auth})
            assert r.status_code == 401 and "admin key" in r.json()["error"]["message"], r.text
        for path, body in (("/agentrl/state", {"policy_version": 9}), ("/agentrl/reset_prefix_cache", {}),
                           ("/agentrl/metrics", {})):
            assert c.post(path, json=body).status_code == 401
        assert _same_bits(bits, _bits(engine)) and _reply(handle) == reply and _version(handle) == 0
        # The same push with the admin key is taken: the key alone made the difference.
        r = c.post("/agentrl/weights", params={"version": 7}, content=zeros, headers={**BINARY, **_admin(handle)})
        assert r.status_code == 200 and r.json() == {"policy_version": 7}
    assert _reply(handle) != reply and _version(handle) == 7


def test_a_cross_origin_push_is_refused_whatever_it_carries(served):
    engine, handle = served
    bits = _bits(engine)
    zeros = to_bytes({k: torch.zeros_like(v) for k, v in engine.model.state_dict().items()})
    page = {"origin": "http://evil.example"}
    with nodelay_client(base_url=handle.url, timeout=60) as c:
        # What a page can send without a CORS preflight: no key, a "simple" content type.
        for kind in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                     "multipart/form-data; boundary=x"):
            r = c.post("/agentrl/weights", params={"version": 3}, content=zeros, headers={"content-type": kind, **page})
            assert r.status_code in (401, 403), (kind, r.text)
        # Even with the key: an Origin, or a body that is not the route's type, is refused.
        r = c.post("/agentrl/weights", params={"version": 3}, content=zeros,
                   headers={**BINARY, **page, **_admin(handle)})
        assert r.status_code == 403 and "web pages" in r.json()["error"]["message"]
        for kind in ("text/plain", "", "application/json-patch+json"):
            r = c.post("/agentrl/weights", params={"version": 3}, content=zeros,
                       headers={"content-type": kind, **_admin(handle)})
            assert r.status_code == 415 and "application/octet-stream" in r.json()["error"]["message"], kind
        r = c.post("/agentrl/state", content=json.dumps({"policy_version": 3}),
                   headers={"content-type": "text/plain", **_admin(handle)})
        assert r.status_code == 415
    assert _same_bits(bits, _bits(engine)) and _version(handle) == 0


def test_a_path_outside_weights_dir_is_refused_without_saying_whether_it_exists(tiny_model, tiny_tokenizer,
                                                                                 tmp_path):
    trusted, outside = tmp_path / "trusted", tmp_path / "outside"
    weights = tiny_model.state_dict()
    save_file_atomic(weights, trusted / "policy.safetensors")
    save_file_atomic(weights, outside / "policy.safetensors")
    (trusted / "link.safetensors").symlink_to(outside / "policy.safetensors")
    engine, handle = _serve(tiny_model, tiny_tokenizer, weights_dir=str(trusted))
    try:
        bits = _bits(engine)
        refused = [str(outside / "policy.safetensors"), str(outside / "nothing.safetensors"), "/etc/passwd",
                   "/etc/nonexistent_file", str(trusted / ".." / "outside" / "policy.safetensors"),
                   "../outside/policy.safetensors", str(trusted / "link.safetensors"), "link.safetensors",
                   str(trusted / "missing.safetensors"), str(outside), "/"]
        answers = set()
        with nodelay_client(base_url=handle.url, headers=_admin(handle), timeout=60) as c:
            for path in refused:
                r = c.post("/agentrl/weights", json={"path": path, "version": 4})
                assert r.status_code == 400, (path, r.text)
                answers.add(r.text.replace(json.dumps(repr(path))[1:-1], "PATH"))
            assert len(answers) == 1, answers  # one answer whatever exists there
            assert "serve.weights_dir" in answers.pop()
            assert _same_bits(bits, _bits(engine)) and _version(handle) == 0
            # Inside the folder, by absolute or relative path, a file loads.
            for path in (str(trusted / "policy.safetensors"), "policy.safetensors"):
                assert c.post("/agentrl/weights", json={"path": path, "version": 4}).json() == {"policy_version": 4}
    finally:
        handle.stop()
    # Without serve.weights_dir (the default) no path is read at all.
    engine, handle = _serve(tiny_model, tiny_tokenizer)
    try:
        r = httpx.post(handle.url + "/agentrl/weights", headers=_admin(handle),
                       json={"path": str(trusted / "policy.safetensors"), "version": 1})
        assert r.status_code == 403 and "serve.weights_dir" in r.json()["error"]["message"]
    finally:
        handle.stop()


def test_a_push_that_does_not_fit_is_refused_and_the_weights_stay_bit_identical(served):
    engine, handle = served
    reply, bits = _reply(handle), _bits(engine)
    good = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    last = sorted(good)[-1]  # copied last: every other tensor would be in before it is reached

    def changed(name, value):
        out = {k: v + 0.5 for k, v in good.items()}  # every tensor differs, so a partial copy shows
        out[name] = value
        return out
    bad = {"NaN": changed(last, torch.full_like(good[last], float("nan"))),
           "infinite": changed(last, torch.full_like(good[last], float("inf"))),
           "lack": {k: v + 0.5 for k, v in good.items() if k != last},
           "does not have": {**changed(last, good[last]), "extra.weight": torch.zeros(2)},
           "shape": changed(last, torch.zeros(*good[last].shape, 2)),
           "int64": changed(last, torch.zeros_like(good[last], dtype=torch.int64)),
           "float64": changed(last, good[last].double())}
    with nodelay_client(base_url=handle.url, headers={**BINARY, **_admin(handle)}, timeout=60) as c:
        for says, state in bad.items():
            r = c.post("/agentrl/weights", params={"version": 5}, content=to_bytes(state))
            assert r.status_code == 400 and says in r.json()["error"]["message"], (says, r.text)
            assert _same_bits(bits, _bits(engine)), f"a refused push ({says}) changed the served weights"
    assert _version(handle) == 0 and _reply(handle) == reply


def _urllib_post(url, body, headers):
    """The status urllib reads (it sends Connection: close and the whole body before reading)."""
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_client_still_uploading_reads_the_413(served):
    _, handle = served
    chat = handle.url + "/v1/chat/completions"
    for size in (10_000_000, 2_100_000) * 3:  # over the 2 MB cap (serve.max_request_bytes)
        assert _urllib_post(chat, b"x" * size, {"content-type": "application/json"}) == 413
        assert _urllib_post(handle.url + "/agentrl/weights?version=1", b"x" * size, BINARY) == 401

    def chunks():  # no Content-Length: the cap is met while the body streams in
        for _ in range(10):
            yield b"x" * 1_000_000
    r = httpx.post(chat, content=chunks(), headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413 and "serve.max_request_bytes" in r.json()["error"]["message"]
    # The model's own size caps a weights body: ten times it is refused before it is held.
    r = httpx.post(handle.url + "/agentrl/weights?version=1", content=chunks(), headers={**BINARY, **_admin(handle)},
                   timeout=60)
    assert r.status_code == 413 and "served model's weights" in r.json()["error"]["message"]
    assert _version(handle) == 0


# ---------------------------------------------------------------- the schema fuzz
# A body is mostly valid (so it reaches templates, tokenizer and engine with odd strings), and
# often has one field, or one field of its first message, replaced by any JSON value.
NASTY = ["", "\ud800", "a\udfffb", "\udbff\udc00", "\x00", "\u202e", "😀", "{{ raise }}", "{% for x in y %}",
         "<|im_start|>", "</s>", "<tool_call>{\"name\": 1}</tool_call>", "agentrl", "x" * 300, "1e308", "NaN"]
strings = st.one_of(st.sampled_from(NASTY), st.text(max_size=12),
                    st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([0, 1, -1, 2, 16, 2**63]),
                    st.floats(allow_nan=False, allow_infinity=False), strings)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(strings, inner, max_size=3)), max_leaves=6)
text_parts = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": strings}), min_size=1, max_size=2)
message = st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
                                 "content": st.one_of(strings, text_parts)})
SAMPLING = {"model": st.one_of(st.just("agentrl"), strings), "max_tokens": st.integers(1, 4),
            "temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1), "top_k": st.integers(-1, 20),
            "n": st.integers(1, 2), "stop": st.one_of(strings, st.lists(strings, max_size=2)),
            "seed": st.integers(0, 2**63 - 1), "stream": st.booleans(), "return_token_ids": st.booleans(),
            "user": strings}
chat_bodies = st.fixed_dictionaries(
    {"messages": st.lists(message, min_size=1, max_size=3)},
    optional={**SAMPLING, "logprobs": st.booleans(), "top_logprobs": st.integers(0, 3),
              "max_completion_tokens": st.integers(1, 4),
              "tools": st.just([{"type": "function", "function": {"name": "move", "parameters": {}}}])})
completion_bodies = st.fixed_dictionaries(
    {"prompt": st.one_of(strings, st.lists(strings, min_size=1, max_size=2), st.lists(st.integers(0, 383), max_size=5),
                         st.lists(st.lists(st.integers(0, 383), max_size=3), min_size=1, max_size=2))},
    optional={**SAMPLING, "logprobs": st.integers(0, 3)})
CHAT_FIELDS = ["messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n",
               "stop", "seed", "stream", "stream_options", "logprobs", "top_logprobs", "tools", "tool_choice",
               "response_format", "return_token_ids", "presence_penalty", "frequency_penalty", "logit_bias", "user",
               "messages.role", "messages.content", "messages.tool_calls", "messages.name", "messages.tool_call_id"]
COMPLETION_FIELDS = ["prompt", "model", "max_tokens", "temperature", "top_p", "top_k", "n", "stop", "seed", "stream",
                     "stream_options", "logprobs", "echo", "best_of", "suffix", "return_token_ids", "logit_bias"]


def _body(data, route):
    """A drawn body: valid, or valid but for one field."""
    completions = route == "completions"
    body = data.draw(completion_bodies if completions else chat_bodies)
    if data.draw(st.booleans()):
        where = data.draw(st.sampled_from(COMPLETION_FIELDS if completions else CHAT_FIELDS))
        value = data.draw(values)
        if where.startswith("messages."):
            body["messages"][0][where.removeprefix("messages.")] = value
        else:
            body[where] = value
    return body


@pytest.fixture(scope="module")
def fuzzed(tiny_model, tiny_tokenizer):
    """One server for the fuzz (no key), and a session of it."""
    _, handle = _serve(tiny_model, tiny_tokenizer)
    with nodelay_client(base_url=handle.url, timeout=60) as c:
        yield c, c.post("/sessions").json()["id"]
    handle.stop()


@settings(max_examples=200, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(route=st.sampled_from(["chat", "session", "completions"]), data=st.data())
@example(route="chat", data=None).via("a lone surrogate in content (a 500 before)")
@example(route="session", data=None).via("a lone surrogate as the model, echoed in a session's reply")
@example(route="completions", data=None).via("a lone surrogate in a prompt")
def test_no_chat_or_completion_body_gets_a_5xx(fuzzed, route, data):
    c, sid = fuzzed
    if data is None:  # the explicit examples above
        body = {"chat": {"messages": [{"role": "user", "content": "\ud800"}], "max_tokens": 2},
                "session": {"model": "\ud800", "messages": MESSAGES, "max_tokens": 2},
                "completions": {"prompt": "a\udfff", "max_tokens": 2}}[route]
    else:
        body = _body(data, route)
    path = {"chat": "/v1/chat/completions", "session": f"/sessions/{sid}/v1/chat/completions",
            "completions": "/v1/completions"}[route]
    r = c.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code < 500, (path, repr(body)[:300], r.text[:300])
    if r.status_code >= 400:
        r.json()["error"]["message"].encode("utf-8")  # a JSON error, in valid UTF-8


# ---------------------------------------------------------------- connections and hosts
def _closed_by_server(sock):
    """Whether the server closes `sock` (reading what it sends first); False if 60 s pass in silence."""
    sock.settimeout(60)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except (TimeoutError, socket.timeout):
        return False, received
    except ConnectionResetError:
        pass
    return True, received


def test_silent_and_half_open_connections_are_closed(tiny_model, tiny_tokenizer):
    _, handle = _serve(tiny_model, tiny_tokenizer, idle_timeout=0.2)
    host, port = handle.url.removeprefix("http://").split(":")
    try:
        starts = [b"",  # connects and says nothing
                  b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n",  # half a head
                  b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"mess",  # a body that stops
                  b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"]  # a request, then keep-alive silence
        for start in starts:
            with socket.create_connection((host, int(port))) as sock:
                sock.sendall(start)
                closed, received = _closed_by_server(sock)
            assert closed, (start, received)
            if b"Content-Length: 100" in start:
                assert received.startswith(b"HTTP/1.1 408"), received
            if start.startswith(b"GET"):
                assert received.startswith(b"HTTP/1.1 200"), received
        assert httpx.get(handle.url + "/health").status_code == 200  # and it keeps serving
    finally:
        handle.stop()


@pytest.mark.parametrize("host", ["127.0.0.1.nip.io", "localhost.example", "0.0.0.0", "::", "127.1"])
def test_a_host_that_is_not_a_loopback_address_needs_a_key(tiny_model, tiny_tokenizer, host, monkeypatch):
    def offline(*args, **kwargs):
        raise AssertionError(f"the loopback check asked a resolver about {args[0]!r}")
    monkeypatch.setattr(socket, "getaddrinfo", offline)  # deciding must not need the network
    with pytest.raises(EngineError, match="not a loopback address"):
        _serve(tiny_model, tiny_tokenizer, host=host)


@pytest.mark.parametrize("host", ["127.0.0.2", "::1", "::ffff:127.0.0.1", "localhost", "localhost."])
def test_a_loopback_address_serves_without_a_key(tiny_model, tiny_tokenizer, host):
    try:
        _, handle = _serve(tiny_model, tiny_tokenizer, host=host)
    except EngineError as e:
        if "Cannot assign requested address" in str(e) or "not available" in str(e):
            pytest.skip(f"this machine has no {host}")
        raise
    try:
        assert httpx.get(handle.url + "/health").status_code == 200
    finally:
        handle.stop()


# ---------------------------------------------------------------- names, origins and body types
# Every route of a keyless server (the default), with a body it takes.
ROUTES = [("GET", "/health", None), ("GET", "/v1/models", None), ("GET", "/agentrl/info", None),
          ("POST", "/v1/chat/completions", {"model": "agentrl", "messages": MESSAGES, "max_tokens": 2}),
          ("POST", "/v1/completions", {"model": "agentrl", "prompt": "FrozenLake", "max_tokens": 2}),
          ("POST", "/inference/v1/generate", {"token_ids": [5, 6], "sampling_params": {"max_tokens": 2}}),
          ("POST", "/agentrl/generate", {"prompt_ids": [5, 6], "sampling": {"max_new_tokens": 2}}),
          ("POST", "/sessions", None)]


def _request(c, method, path, body, headers):
    content = None if body is None else json.dumps(body)
    kind = {} if body is None else {"content-type": "application/json"}
    return c.request(method, path, content=content, headers={**kind, **headers})


def test_a_foreign_host_is_refused_on_every_route_and_the_server_keeps_serving(served):
    """DNS rebinding: a page of evil.example re-pointed at 127.0.0.1 sends `Host: evil.example`
    and could read the answers; every route refuses it, and answers its own names."""
    _, handle = served
    port = handle.url.rsplit(":", 1)[1]
    foreign = ["evil.example", f"evil.example:{port}", "127.0.0.1.nip.io", f"localhost.evil.example:{port}",
               "localhost@evil.example", "", "[::2]", "127.0.0.1:99999"]
    with nodelay_client(base_url=handle.url, timeout=60) as c:
        for method, path, body in ROUTES:
            for host in foreign:
                r = _request(c, method, path, body, {"host": host})
                assert r.status_code == 400 and r.json()["error"]["code"] == "host_refused", (path, host, r.text)
                assert "\n" not in r.json()["error"]["message"]
            for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST."):
                r = _request(c, method, path, body, {"host": host})
                assert r.status_code == 200, (path, host, r.text)
    assert _reply(handle)  # the real openai client over loopback still works


def test_a_cross_origin_or_non_json_request_is_refused_on_every_route(served):
    """A page can POST `text/plain` across origins without a preflight: no route takes it; a page
    of another host is refused whatever it sends; a page of this server's own names is not."""
    _, handle = served
    with nodelay_client(base_url=handle.url, timeout=60) as c:
        for method, path, body in ROUTES:
            for origin in ("http://evil.example", "https://evil.example:443", "null", "http://localhost.evil.example"):
                r = _request(c, method, path, body, {"origin": origin})
                assert r.status_code == 403 and r.json()["error"]["code"] == "origin_refused", (path, origin, r.text)
            r = _request(c, method, path, body, {"origin": "http://localhost:3000"})
            assert r.status_code == 200, (path, r.text)
            if method != "POST":
                continue
            for kind in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x") + (("",) if body is not None else ()):
                r = c.post(path, content=json.dumps(body or {}), headers={"content-type": kind} if kind else {})
                assert r.status_code == 415 and "application/json" in r.json()["error"]["message"], (path, kind, r.text)
        assert c.post("/sessions").status_code == 200  # a route that reads no body needs no type
    assert _reply(handle)


def test_a_session_s_base_url_is_the_server_s_own_address_not_the_client_s_host(served):
    _, handle = served
    port = handle.url.rsplit(":", 1)[1]
    with nodelay_client(base_url=handle.url, timeout=60) as c:
        for host in ("localhost", f"localhost:{port}", f"[::1]:{port}", f"127.0.0.1:{port}"):
            opened = c.post("/sessions", headers={"host": host}).json()
            assert opened["base_url"] == f"{handle.url}/sessions/{opened['id']}/v1", (host, opened)
    client = openai.OpenAI(base_url=opened["base_url"], api_key="unused", max_retries=0, http_client=nodelay_client())
    r = client.chat.completions.create(model="agentrl", messages=MESSAGES, max_tokens=2, temperature=0)
    assert r.choices[0].message.role == "assistant"


def test_serve_allowed_hosts_adds_names_and_a_wildcard_bind_any_address(tiny_model, tiny_tokenizer):
    from agentrl.llm.server.guard import AllowedHosts

    _, handle = _serve(tiny_model, tiny_tokenizer, allowed_hosts=["gpu-3.internal", "10.0.0.7", "fd00::7"])
    try:
        with nodelay_client(base_url=handle.url, timeout=60) as c:
            for host, status in (("gpu-3.internal:8000", 200), ("GPU-3.internal", 200), ("10.0.0.7:1", 200),
                                 ("[fd00::7]:80", 200), ("gpu-4.internal", 400), ("10.0.0.8", 400)):
                assert c.get("/v1/models", headers={"host": host}).status_code == status, host
            r = c.post("/v1/chat/completions", headers={"origin": "http://gpu-3.internal:9000"},
                       json={"model": "agentrl", "messages": MESSAGES, "max_tokens": 2})
            assert r.status_code == 200, r.text
    finally:
        handle.stop()
    wildcard = AllowedHosts([])
    wildcard.bound("0.0.0.0", "0.0.0.0")  # reached by any address of the machine: any IP literal
    assert "10.1.2.3" in wildcard and "::1" in wildcard and "evil.example" not in wildcard
    assert "evil.example" in AllowedHosts(["*"])


@pytest.mark.parametrize("value, says", [
    ("[http://gpu-3]", "serve.allowed_hosts[0]='http://gpu-3' is not a host name"),
    ("[gpu-3:8000]", "serve.allowed_hosts[0]='gpu-3:8000' is not a host name"),
    ("['a b']", "serve.allowed_hosts[0]='a b' is not a host name"),
])
def test_a_bad_allowed_host_is_one_line(value, says):
    from agentrl.config import load_config
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(None, [f"serve.allowed_hosts={value}"])
    assert says in str(err.value) and "\n" not in str(err.value)
