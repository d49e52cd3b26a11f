"""The routes of the policy server (server.py builds the app and runs it).

Every request body is read with a size cap, counted as it streams in (413 beyond it; see
server_guard.py), parsed as strict JSON into a schema (400 naming the field), and only then
reaches the engine, in the engine's own loop. New weights are checked whole (names, shapes,
dtypes, finite values) before one tensor is copied, so a refused push changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentrl.llm.server.chat_messages import check_tools, normalize_messages, render
from agentrl.llm.conversation import completion_versions, encode_text
from agentrl.llm.server.openai_format import (chat_body, chat_events, completion_body, completion_choice, completion_events,
                                       new_id, vllm_body)
from agentrl.llm.server.openai_schema import (AgentrlGenerateRequest, ChatRequest, CompletionRequest, RequestError,
                                       RewardRequest, StateRequest, VllmGenerateRequest, WeightsRequest,
                                       agentrl_sampling, parse, refuse_unsupported, request_sampling, sampling_params,
                                       vllm_sampling)
from agentrl.config.serve import ServeConfig
from agentrl.llm.server.guard import JSON, media_type, read_body
from agentrl.llm.server.state import ServerState
from agentrl.llm.server.sessions import RequestPolicy, Session, in_loop, make_choice
from agentrl.llm.weights import body_limit, check_fits, from_bytes, from_weights_dir, served_layout, top_logprobs

# JSON text that may decode to a lone UTF-16 surrogate: an escape of one (a valid pair matches
# too, and is then let through) or the CESU-8 bytes of one (json decodes bytes with surrogatepass).
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


async def read_json(request: Request, cfg: ServeConfig) -> Any:
    """The request body as JSON (400 when it is not, or when a string in it is not valid Unicode)."""
    body = await read_body(request, cfg.max_request_bytes, cfg.idle_timeout)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:
        first = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise RequestError(400, f"the request body is not valid JSON: {first}") from None
    if _SURROGATE.search(body):
        where = _unpaired(data, "")
        if where is not None:
            raise RequestError(400, f"{where or 'body'}: a lone UTF-16 surrogate (e.g. \\ud800) is not a character; "
                                    "send valid Unicode", where or None)
    return data


def _unpaired(value: Any, where: str) -> str | None:
    """Where in `value` a string holds a lone surrogate (None: nowhere)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and _unpaired(key, where) is not None:
            return where
        found = _unpaired(item, f"{where}.{key}".lstrip(".") if isinstance(key, str) else f"{where}[{key}]")
        if found is not None:
            return found
    return None


@contextlib.contextmanager
def admitted(state: ServerState) -> Iterator[None]:
    """Count a generation request in flight; 429 beyond serve.max_inflight."""
    if state.inflight >= state.cfg.max_inflight:
        raise RequestError(429, f"the server is busy ({state.inflight} requests in flight, serve.max_inflight)")
    state.inflight += 1
    try:
        yield
    finally:
        state.inflight -= 1


def check_model(state: ServerState, model: str | None) -> None:
    """404 for a model id this server does not serve (sessions accept any), or when it serves
    no engine (a run's session server)."""
    if state.engine is None:
        raise RequestError(404, "this server only hosts sessions: use /sessions/<id>/v1/chat/completions")
    if model is not None and model != state.model_name:
        raise RequestError(404, f"model {model!r} does not exist; this server serves {state.model_name!r}",
                           "model", "model_not_found")


def eos_ids(tokenizer: Any) -> tuple[int, ...]:
    """The ids that end a reply."""
    return (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ()


async def _top(llm: Any, loop: Any, prompt: list[int], choices: list[Any], k: int, temperature: float) -> Any:
    """top_logprobs of every choice, from a scoring pass in the engine's loop (local engines only)."""
    model = getattr(llm, "model", None)
    if model is None:
        raise RequestError(400, "top_logprobs>0 needs an in-process engine; this one reports only the sampled "
                                "token's logprob (ask logprobs without top_logprobs)", "top_logprobs")

    async def score() -> Any:
        return [top_logprobs(model, prompt, list(c.completion.token_ids), k, temperature) for c in choices]
    return await in_loop(loop, score)


async def serve_chat(state: ServerState, req: ChatRequest, session: Session | None) -> Any:
    """A chat completion, plain or within a session."""
    refuse_unsupported(req)
    rs = request_sampling(req, state.cfg.max_tokens, state.cfg.max_n, req.max_completion_tokens or req.max_tokens)
    tools = check_tools(req.tools)
    with admitted(state):
        if session is not None:
            tokenizer, llm, loop = session.tokenizer, session.llm, session.loop
            reply = await session.chat(req.messages, tools, rs)
            prompt, choices, version = reply.prompt_ids, reply.choices, int(getattr(llm, "policy_version", 0))
        else:
            tokenizer, llm, loop = state.tokenizer, state.engine, state.engine_loop
            prompt = encode_text(tokenizer, render(tokenizer, normalize_messages(req.messages), tools, True))
            plans = sampling_params(rs, state.cfg.max_tokens, eos_ids(tokenizer))
            completions = await asyncio.gather(*(state.call(llm.generate, prompt, sp) for sp in plans))
            choices, version = [make_choice(tokenizer, c, bool(tools)) for c in completions], state.version()
        top = None
        if req.logprobs and req.top_logprobs:
            top = await _top(llm, loop, prompt, choices, req.top_logprobs, rs.temperature or 1.0)
    body = chat_body(state.model_name if session is None else (req.model or state.model_name), prompt, choices,
                     tokenizer, logprobs=req.logprobs, top=top, with_ids=req.return_token_ids or session is not None,
                     version=version)
    if req.stream:
        usage = bool((req.stream_options or {}).get("include_usage"))
        return StreamingResponse(chat_events(body, choices, tokenizer, usage), media_type="text/event-stream")
    return JSONResponse(body)


def _prompts(tokenizer: Any, prompt: Any, limit: int) -> list[list[int]]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise RequestError(400, "prompt must not be empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        prompt = [prompt]
    if len(prompt) > limit:
        raise RequestError(400, f"at most {limit} prompts per request (serve.max_n)", "prompt")
    return [encode_text(tokenizer, p) if isinstance(p, str) else list(p) for p in prompt]


def add_routes(app: FastAPI, state: ServerState) -> None:
    """Attach every route to `app`."""
    cfg = state.cfg

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": state.model_name, "policy_version": state.version()}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": 0,
                                            "owned_by": "agentrl"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        req = parse(ChatRequest, await read_json(request, cfg))
        check_model(state, req.model)
        return await serve_chat(state, req, None)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        req = parse(CompletionRequest, await read_json(request, cfg))
        check_model(state, req.model)
        refuse_unsupported(req)
        rs = request_sampling(req, cfg.max_tokens, cfg.max_n)
        tok = state.tokenizer
        prompts = _prompts(tok, req.prompt, cfg.max_n)
        plans = sampling_params(rs, cfg.max_tokens, eos_ids(tok))
        with admitted(state):
            results = await asyncio.gather(*(state.call(state.engine.generate, p, sp) for p in prompts for sp in plans))
            choices = [make_choice(tok, c, False) for c in results]
            top = None
            if req.logprobs:  # legacy logprobs=N: the N most likely ids at each position
                top = [(await _top(state.engine, state.engine_loop, prompts[i // rs.n], [ch], req.logprobs,
                                   rs.temperature or 1.0))[0] for i, ch in enumerate(choices)]
        items = [completion_choice(i, prompts[i // rs.n], ch, tok, req.logprobs, top[i] if top else None,
                                   req.return_token_ids) for i, ch in enumerate(choices)]
        body = completion_body(state.model_name, items, sum(len(p) for p in prompts) * rs.n,
                               sum(len(c.completion.token_ids) for c in choices), state.version())
        if req.stream:
            usage = bool((req.stream_options or {}).get("include_usage"))
            return StreamingResponse(completion_events(body, usage), media_type="text/event-stream")
        return JSONResponse(body)

    @app.post("/inference/v1/generate")
    async def vllm_generate(request: Request) -> Any:
        req = parse(VllmGenerateRequest, await read_json(request, cfg))
        check_model(state, req.model)
        if req.stream:
            raise RequestError(400, "stream=true is not supported on /inference/v1/generate", "stream")
        sp = vllm_sampling(req.sampling_params, cfg.max_tokens, cfg.max_tokens)
        with admitted(state):
            completion = await state.call(state.engine.generate, req.token_ids, sp)
        choice = make_choice(state.tokenizer, completion, False)
        return vllm_body(req.request_id or new_id("gen"), choice, state.tokenizer,
                         req.sampling_params.logprobs is not None)

    @app.post("/agentrl/generate")
    async def agentrl_generate(request: Request) -> Any:
        req = parse(AgentrlGenerateRequest, await read_json(request, cfg))
        check_model(state, None)
        sp = agentrl_sampling(req.sampling, cfg.max_tokens)
        with admitted(state):
            c = await state.call(state.engine.generate, req.prompt_ids, sp)
        return {"token_ids": list(c.token_ids), "logprobs": list(c.logprobs), "finish_reason": c.finish_reason,
                "policy_version": c.policy_version, "versions": completion_versions(c), "stop_reason": c.stop_reason,
                "kv_version": c.kv_version}

    @app.post("/agentrl/weights")
    async def weights(request: Request) -> Any:
        check_model(state, None)
        model = getattr(state.engine, "model", None)
        if model is None:
            raise RequestError(400, "this engine takes no weights over HTTP (it serves no in-process model)")
        layout = await state.call(served_layout, model)
        limit = min(cfg.max_weights_bytes, body_limit(layout))
        if media_type(dict(request.scope["headers"])) == JSON:
            req = parse(WeightsRequest, await read_json(request, cfg))
            if cfg.weights_dir is None:
                raise RequestError(403, "this server takes weights in the request body only; to load files, start "
                                        "it with serve.weights_dir=FOLDER (the run's engine.weights_dir)", "path")
            version, load = req.version, (lambda: from_weights_dir(req.path, cfg.weights_dir, limit))
        else:  # application/octet-stream (the Guard let nothing else through)
            raw = request.query_params.get("version", "")
            if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
                raise RequestError(400, "a weights body needs ?version=N (the new policy version)", "version")
            data = await read_body(request, limit, cfg.idle_timeout, "the served model's weights in their dtype or "
                                                                     "float32, and serve.max_weights_bytes")
            version, load = int(raw), (lambda: from_bytes(data))

        def checked() -> dict[str, Any]:
            tensors = load()
            check_fits(layout, tensors)
            return tensors
        try:
            tensors = await asyncio.to_thread(checked)
        except ValueError as e:
            raise RequestError(400, str(e)) from None
        return {"policy_version": await state.call(_apply_weights, state.engine, tensors, version)}

    @app.get("/agentrl/info")
    async def info() -> dict[str, Any]:
        from agentrl.models.embedded import fingerprint

        e = state.engine
        return {"model": state.model_name, "policy_version": state.version(),
                "vocab_size": getattr(e, "vocab_size", None), "max_model_len": getattr(e, "max_model_len", None),
                "tokenizer": fingerprint(state.tokenizer) if state.tokenizer is not None else None}

    @app.post("/agentrl/state")
    async def set_state(request: Request) -> dict[str, Any]:
        req = parse(StateRequest, await read_json(request, cfg))

        def apply() -> int:
            state.engine.policy_version = req.policy_version
            return req.policy_version
        return {"policy_version": await state.call(apply)}

    @app.post("/agentrl/reset_prefix_cache")
    async def reset_prefix_cache() -> dict[str, Any]:
        check_model(state, None)
        return {"reset": bool(await state.call(state.engine.reset_prefix_cache))}

    @app.post("/agentrl/metrics")
    async def metrics() -> dict[str, Any]:
        check_model(state, None)
        return {"metrics": await state.call(state.engine.pop_metrics)}

    add_session_routes(app, state)


def _apply_weights(engine: Any, tensors: dict[str, Any], version: int) -> int:
    """Load `tensors` into the engine (between two of its steps) and make `version` current."""
    previous = engine.policy_version
    engine.policy_version = version - 1  # load_weights adds one
    try:
        engine.load_weights(tensors)
    except (RuntimeError, KeyError, ValueError) as e:
        engine.policy_version = previous
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise RequestError(400, f"the weights do not fit the served model: {first}") from None
    engine.policy_version = version
    return version


def add_session_routes(app: FastAPI, state: ServerState) -> None:
    """Sessions: open one over HTTP (served by this server's engine), read its record, reward it."""
    cfg, store = state.cfg, state.sessions

    @app.post("/sessions")
    async def open_session(request: Request) -> dict[str, Any]:
        if state.engine is None:
            raise RequestError(404, "this server opens sessions in-process only")
        session = store.open(state.tokenizer, state.engine, state.engine_loop,
                             RequestPolicy(cfg.max_tokens, eos_ids(state.tokenizer)))
        return {"id": session.id, "base_url": f"{str(request.base_url).rstrip('/')}/sessions/{session.id}/v1"}

    @app.get("/sessions/{sid}")
    async def read_session(sid: str) -> dict[str, Any]:
        session = store.get(sid)
        segments = [{"token_ids": r.token_ids, "loss_mask": r.loss_mask, "logprobs": r.logprobs,
                     "versions": r.versions, "rewards": r.rewards, "reward_positions": r.reward_positions}
                    for r, _, _ in session.records(session.posted_reward)]
        return {"id": sid, "turns": len(session.turns), "new_segments": session.segments, "segments": segments}

    @app.post("/sessions/{sid}/reward")
    async def reward(sid: str, request: Request) -> dict[str, Any]:
        req = parse(RewardRequest, await read_json(request, cfg))
        store.get(sid).posted_reward = req.reward
        return {"id": sid, "reward": req.reward}

    @app.delete("/sessions/{sid}")
    async def close_session(sid: str) -> dict[str, Any]:
        if store.close(sid) is None:
            raise RequestError(404, "no such session", code="session_not_found")
        return {"id": sid, "deleted": True}

    @app.get("/sessions/{sid}/v1/models")
    async def session_models(sid: str) -> dict[str, Any]:
        store.get(sid)
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": 0,
                                            "owned_by": "agentrl"}]}

    @app.post("/sessions/{sid}/v1/chat/completions")
    async def session_chat(sid: str, request: Request) -> Any:
        session = store.get(sid)
        req = parse(ChatRequest, await read_json(request, cfg))
        return await serve_chat(state, req, session)
