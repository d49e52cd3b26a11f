"""The OpenAI-compatible routes of the policy server (app.py builds the app and runs it), plain and
per session, and vLLM's token route:

    GET  /health, /v1/models; POST /v1/chat/completions, /v1/completions      (add_openai_routes)
    POST /inference/v1/generate                                                (add_vllm_routes)
    POST /sessions, GET|DELETE /sessions/<id>, POST /sessions/<id>/reward,
         /sessions/<id>/v1/models, /sessions/<id>/v1/chat/completions          (add_session_routes)

Each body is read and parsed into its schema (400 naming the field) before it reaches the engine
(state.py); our own token and control routes are in agentrl_routes.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentrl.llm.encoding import encode_chat, encode_text
from agentrl.llm.server.chat_messages import check_tools, normalize_messages, render
from agentrl.llm.server.openai_format import (
    chat_body,
    chat_events,
    completion_body,
    completion_choice,
    completion_events,
    new_id,
    vllm_body,
)
from agentrl.llm.server.openai_schema import (
    ChatRequest,
    CompletionRequest,
    RequestError,
    RewardRequest,
    VllmGenerateRequest,
    parse,
    refuse_unsupported,
    request_sampling,
    sampling_params,
    vllm_sampling,
)
from agentrl.llm.server.sessions import RequestPolicy, Session, in_loop, make_choice
from agentrl.llm.server.state import ServerState, admitted, check_model, eos_ids, read_json
from agentrl.llm.weights import top_logprobs
from agentrl.tokenizer import Tokenizer


def add_openai_routes(app: FastAPI, state: ServerState) -> None:
    """OpenAI's routes: liveness, the served model, chat and text completions."""
    cfg = state.cfg

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": state.model_name, "policy_version": state.version()}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return model_list(state)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        req = parse(ChatRequest, await read_json(request, cfg))
        check_model(state, req.model)
        return await serve_chat(state, req, None)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        req = parse(CompletionRequest, await read_json(request, cfg))
        check_model(state, req.model)
        return await serve_completions(state, req)


def add_vllm_routes(app: FastAPI, state: ServerState) -> None:
    """vLLM's token-in/token-out route."""
    cfg = state.cfg

    @app.post("/inference/v1/generate")
    async def vllm_generate(request: Request) -> Any:
        req = parse(VllmGenerateRequest, await read_json(request, cfg))
        check_model(state, req.model)
        if req.stream:
            raise RequestError(400, "stream=true is not supported on /inference/v1/generate", "stream")
        sp = vllm_sampling(req.sampling_params, cfg.max_tokens, cfg.max_tokens)
        with admitted(state):
            completion = await state.call(state.engine.generate, req.token_ids, sp)
        choice = make_choice(state.served_tokenizer, completion, False)
        return vllm_body(req.request_id or new_id("gen"), choice, state.served_tokenizer,
                         req.sampling_params.logprobs is not None)


def model_list(state: ServerState) -> dict[str, Any]:
    """The body of /v1/models: the one model this server serves."""
    return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": 0,
                                        "owned_by": "agentrl"}]}


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
            tokenizer, llm, loop = state.served_tokenizer, state.engine, state.engine_loop
            prompt = encode_chat(tokenizer, render(tokenizer, normalize_messages(req.messages), tools, True))
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


async def serve_completions(state: ServerState, req: CompletionRequest) -> Any:
    """A text completion: every prompt (text or ids) times n choices."""
    cfg = state.cfg
    refuse_unsupported(req)
    rs = request_sampling(req, cfg.max_tokens, cfg.max_n)
    tok = state.served_tokenizer
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


def _prompts(tokenizer: Tokenizer, prompt: Any, limit: int) -> list[list[int]]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise RequestError(400, "prompt must not be empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        prompt = [prompt]
    if len(prompt) > limit:
        raise RequestError(400, f"at most {limit} prompts per request (serve.max_n)", "prompt")
    return [encode_text(tokenizer, p) if isinstance(p, str) else list(p) for p in prompt]


def own_url(scope: MutableMapping[str, Any]) -> str:
    """This server's URL from its own side of the connection (the address and port the client
    reached), never from the client's `Host` header."""
    host, port = scope["server"]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def add_session_routes(app: FastAPI, state: ServerState) -> None:
    """Sessions: open one over HTTP (served by this server's engine), read its record, reward it."""
    cfg, store = state.cfg, state.sessions

    @app.post("/sessions")
    async def open_session(request: Request) -> dict[str, Any]:
        if state.engine is None:
            raise RequestError(404, "this server opens sessions in-process only")
        session = store.open(state.served_tokenizer, state.engine, state.engine_loop,
                             RequestPolicy(cfg.max_tokens, eos_ids(state.served_tokenizer)))
        return {"id": session.id, "base_url": f"{own_url(request.scope)}/sessions/{session.id}/v1"}

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
        return model_list(state)

    @app.post("/sessions/{sid}/v1/chat/completions")
    async def session_chat(sid: str, request: Request) -> Any:
        session = store.get(sid)
        req = parse(ChatRequest, await read_json(request, cfg))
        return await serve_chat(state, req, session)
