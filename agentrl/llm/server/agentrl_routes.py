"""Our own routes of the policy server (app.py builds the app and runs it): token ids in, a
`Completion` out, what the server serves; and the control routes that change it (new weights, the
policy version, the prefix cache, the engine's metrics), which always take a key (guard.py's
ADMIN_ROUTES):

    POST /agentrl/generate, GET /agentrl/info                                  (add_agentrl_routes)
    POST /agentrl/weights, /agentrl/adapter, /agentrl/state, /agentrl/reset_prefix_cache,
    /agentrl/metrics                                                           (add_control_routes)

New weights are checked whole (names, shapes, dtypes, finite values) before one tensor is copied,
so a refused push changes nothing. A LoRA run pushes its adapter instead (/agentrl/adapter: the
tensors and their peft config, llm/weights.py), checked whole the same way against what that
config gives the served model; the first one injects the adapter layers, later ones copy tensors.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request

from agentrl.llm.conversation import completion_versions
from agentrl.llm.server.guard import JSON, media_type, read_body
from agentrl.llm.server.openai_schema import (
    AgentrlGenerateRequest,
    RequestError,
    StateRequest,
    WeightsRequest,
    agentrl_sampling,
    parse,
)
from agentrl.llm.server.state import ServerState, admitted, check_model, read_json
from agentrl.llm.weights import (
    adapter_from_bytes,
    body_limit,
    check_fits,
    from_bytes,
    from_weights_dir,
    served_layout,
    weights_file,
)
from agentrl.models.lora import ADAPTER_CONFIG, check_adapter


def add_agentrl_routes(app: FastAPI, state: ServerState) -> None:
    """Token ids in, a Completion out (every SamplingParams field, per-id versions); what is served."""
    cfg = state.cfg

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

    @app.get("/agentrl/info")
    async def info() -> dict[str, Any]:
        from agentrl.models.embedded import fingerprint

        e = state.engine
        return {"model": state.model_name, "policy_version": state.version(),
                "vocab_size": getattr(e, "vocab_size", None), "max_model_len": getattr(e, "max_model_len", None),
                "tokenizer": fingerprint(state.tokenizer) if state.tokenizer is not None else None}


def add_control_routes(app: FastAPI, state: ServerState) -> None:
    """The routes that change what the server serves: weights, policy version, prefix cache, metrics."""
    cfg = state.cfg

    @app.post("/agentrl/weights")
    async def weights(request: Request) -> Any:
        return {"policy_version": await receive_weights(state, request)}

    @app.post("/agentrl/adapter")
    async def adapter(request: Request) -> Any:
        return {"policy_version": await receive_weights(state, request, adapter=True)}

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


async def receive_weights(state: ServerState, request: Request, adapter: bool = False) -> int:
    """Load the weights a request brings (a file of serve.weights_dir named in JSON, or a
    safetensors body with ?version=N), checked whole first; the policy version now served.
    `adapter`: a LoRA adapter state (llm/weights.py) rather than the whole model's."""
    cfg = state.cfg
    check_model(state, None)
    model = getattr(state.engine, "model", None)
    if model is None:
        raise RequestError(400, "this engine takes no weights over HTTP (it serves no in-process model)")
    layout = await state.call(served_layout, model)
    limit = min(cfg.max_weights_bytes, body_limit(layout))  # an adapter is never larger than its model
    if media_type(dict(request.scope["headers"])) == JSON:
        req = parse(WeightsRequest, await read_json(request, cfg))
        if cfg.weights_dir is None:
            raise RequestError(403, "this server takes weights in the request body only; to load files, start "
                                    "it with serve.weights_dir=FOLDER (the run's engine.weights_dir)", "path")
        folder = cfg.weights_dir
        version = req.version
        load = (lambda: adapter_from_bytes(weights_file(req.path, folder, limit).read_bytes(), ADAPTER_CONFIG)) \
            if adapter else (lambda: from_weights_dir(req.path, folder, limit))
    else:  # application/octet-stream (the Guard let nothing else through)
        raw = request.query_params.get("version", "")
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
            raise RequestError(400, "a weights body needs ?version=N (the new policy version)", "version")
        data = await read_body(request, limit, cfg.idle_timeout, "the served model's weights in their dtype or "
                                                                 "float32, and serve.max_weights_bytes")
        version = int(raw)
        load = (lambda: adapter_from_bytes(data, ADAPTER_CONFIG)) if adapter else (lambda: from_bytes(data))

    def checked() -> dict[str, Any]:
        tensors = load()
        if adapter:
            check_adapter(model, tensors)
        else:
            check_fits(layout, tensors)
        return tensors
    try:
        tensors = await asyncio.to_thread(checked)
    except ValueError as e:
        raise RequestError(400, str(e)) from None
    return await state.call(_apply_weights, state.engine, tensors, version)


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
