"""engine.kind=remote: generation on the inference servers of engine.urls (`agentrl serve`, vLLM or
SGLang), in their wire format, with the run's weights pushed to them after every update."""

from __future__ import annotations

from typing import Any

import torch

from agentrl.config import Config, EngineConfig
from agentrl.errors import ConfigError
from agentrl.llm.engine import InferenceEngine
from agentrl.llm.remote.engine import RemoteEngine, server_info
from agentrl.models.embedded import fingerprint
from agentrl.models.lora import base_state
from agentrl.runtime.assembly.engines import check_servers
from agentrl.runtime.assembly.plan_types import EngineKind, RunPlan
from agentrl.tokenizer import Tokenizer


class RemoteKind(EngineKind):
    """The servers of engine.urls, reached by a `RemoteEngine` that first sends them the run's own
    initial weights (version 0), so a run never depends on what a server held before."""

    served = True

    def attached(self, e: EngineConfig) -> bool:
        """On the servers of engine.urls (which the config's checks require for this kind)."""
        return bool(e.urls)

    def check(self, cfg: Config) -> None:
        """Every server answers and takes the run's key."""
        check_servers(cfg, cfg.engine.protocol, "; start the server first (e.g. `agentrl serve CONFIG "
                                                "serve.port=PORT`) or fix engine.urls")

    def make(self, run_plan: RunPlan, model: Any, tokenizer: Tokenizer, device: torch.device) -> InferenceEngine:
        """A `RemoteEngine` on engine.urls serving `model`'s weights as version 0 (`agentrl serve`
        servers must hold this run's tokenizer)."""
        e, key = run_plan.engine, run_plan.engine_key
        if e.protocol == "agentrl":
            ours = fingerprint(tokenizer)
            for i, url in enumerate(e.urls):
                theirs = server_info(url, key).get("tokenizer")
                if theirs != ours:
                    raise ConfigError(f"engine.urls[{i}]={url} serves a model with another tokenizer than this "
                                      "run's; start it from the same config (model.path, model.tiny, env) as the run")
        engine = RemoteEngine(e.urls, e.protocol, api_key=key, timeout=e.request_timeout, max_retries=e.max_retries,
                              weights_dir=e.weights_dir, model_config=getattr(model, "config", None),
                              seed=run_plan.seed)
        engine.load_weights(base_state(model), version=0)  # LoRA: the adapters follow with the first update
        return engine

    def to_dict(self, run_plan: RunPlan) -> dict[str, Any]:
        """plan.json's engine section, with the servers' wire format."""
        return {**super().to_dict(run_plan), "protocol": run_plan.engine.protocol}

    def describe(self, run_plan: RunPlan) -> list[tuple[str, str]]:
        """One line: the servers and their wire format."""
        e = run_plan.engine
        return [("engine", f"remote, {len(e.urls)} server(s) ({e.protocol}): {', '.join(e.urls)}")]
