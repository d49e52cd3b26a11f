"""engine.kind=vllm: vLLM servers the run starts on its model (engine.vllm) or attaches to
(engine.urls), synced every step through vLLM's RL routes and checked on a probe (the engine
itself: runtime/assembly/vllm_engine.py)."""

from __future__ import annotations

from typing import Any

import torch

from agentrl.config import Config, EngineConfig
from agentrl.llm.engine import InferenceEngine
from agentrl.llm.vllm.launch import vllm_python
from agentrl.runtime.assembly.engines import check_servers
from agentrl.runtime.assembly.plan_types import EngineKind, RunPlan
from agentrl.runtime.assembly.vllm_engine import SERVING_DIR, check_vllm_python, vllm_engine
from agentrl.tokenizer import Tokenizer


class VllmKind(EngineKind):
    """vLLM servers: started by the run (on Ray, one by each engine replica actor) or those of
    engine.urls."""

    served = True
    ray_replica = "vllm"
    replicas_start = "vLLM servers"
    server_versions = True  # attached vLLM servers label their weights with our versions (VllmEngine)

    def attached(self, e: EngineConfig) -> bool:
        """On the servers of engine.urls when given, else on servers the run starts."""
        return bool(e.urls)

    def check(self, cfg: Config) -> None:
        """vLLM's interpreter can start the servers, or every server of engine.urls answers."""
        e = cfg.engine
        if not e.urls:
            check_vllm_python(e.vllm.python)
        check_servers(cfg, "vllm", "; start the vLLM server first, with agentrl's weight transport "
                                   "(docs/engines.md), or fix engine.urls")

    def make(self, run_plan: RunPlan, model: Any, tokenizer: Tokenizer, device: torch.device) -> InferenceEngine:
        """The run's `VllmEngine` (started or attached to), checked on the probe after every push."""
        return vllm_engine(run_plan, model, tokenizer)

    def wire_protocol(self, e: EngineConfig) -> str:
        """vLLM's own generate route, whatever engine.protocol says."""
        return "vllm"

    def weights_route(self, e: EngineConfig) -> str:
        """vLLM's weight transfer."""
        return f"vLLM's weight transfer ({e.vllm.weight_transfer})"

    def to_dict(self, run_plan: RunPlan) -> dict[str, Any]:
        """plan.json's engine section, with the servers as this run would start or attach to them."""
        return {**super().to_dict(run_plan), "vllm": servers(run_plan)}

    def describe(self, run_plan: RunPlan) -> list[tuple[str, str]]:
        """Two lines: the servers, and what each sync does."""
        e, v = run_plan.engine, servers(run_plan)
        started = (f"{run_plan.runtime.actor_infer.world_size} server(s) started by the engine replicas (one each)"
                   if run_plan.runtime.kind == "ray" else f"{e.vllm.replicas} server(s) started by the run on loopback")
        where = (f"attached to {len(e.urls)} server(s): {', '.join(e.urls)}" if e.urls else
                 f"{started} with {v['python']} ({v['python_source']}), ready within {e.vllm.startup_timeout:g} s")
        return [("engine", f"vllm, {where}" + (f"; server args {' '.join(e.vllm.args)}" if e.vllm.args else "")),
                ("", f"each sync: pause ({v['pause_mode']}), weights from {v['weights_dir']}, version label, resume; "
                     f"then the probe within {e.vllm.probe_tolerance:g} nats of the trainer")]

    def checks(self, run_plan: RunPlan) -> list[str]:
        """vLLM's interpreter, when the run starts the servers."""
        return [] if run_plan.engine.urls else ["vLLM's interpreter"]


def servers(run_plan: RunPlan) -> dict[str, Any]:
    """The vLLM servers as this run would start or attach to them (plan.json's engine.vllm)."""
    e, v = run_plan.engine, run_plan.engine.vllm
    python, source = vllm_python(v.python)
    count = run_plan.runtime.actor_infer.world_size if run_plan.runtime.kind == "ray" else v.replicas
    started = f"{count} started by the run"
    return {"servers": "attached: engine.urls" if e.urls else started,
            "python": None if e.urls else python, "python_source": None if e.urls else source,
            "args": list(v.args), "startup_timeout": v.startup_timeout, "probe_tolerance": v.probe_tolerance,
            "weight_transfer": v.weight_transfer,
            "pause_mode": run_plan.vllm_pause_mode,
            "weights_dir": e.weights_dir or (None if e.urls else f"{run_plan.run_dir}/{SERVING_DIR}/vllm-weights")}
