"""engine.kind=local: the in-process engine, a copy of the policy in the trainer's process (on
Ray, one per engine replica actor)."""

from __future__ import annotations

import copy
from typing import Any

import torch

from agentrl.llm.engine import InferenceEngine
from agentrl.models.loading import DTYPES
from agentrl.runtime.assembly.plan_types import EngineKind, RunPlan
from agentrl.tokenizer import Tokenizer


class LocalKind(EngineKind):
    """The in-process engine (`LocalEngine`): continuous batching and prefix reuse on a copy of
    the policy, synced between two engine steps."""

    def make(self, run_plan: RunPlan, model: Any, tokenizer: Tokenizer, device: torch.device) -> InferenceEngine:
        """A copy of `model` on `device` in the run's dtype, served by a `LocalEngine`."""
        # Imported here: the engine pulls in transformers' model stack (seconds), which `agentrl plan`
        # and every refusal of a bad config, made before any model, never need.
        from agentrl.llm.local.engine import LocalEngine

        engine_model = copy.deepcopy(model).to(device=device, dtype=DTYPES[run_plan.model.dtype])
        return LocalEngine.from_config(engine_model, tokenizer, run_plan.engine, run_plan.rollout.max_model_len,
                                       seed=run_plan.seed)

    def describe(self, run_plan: RunPlan) -> list[tuple[str, str]]:
        """One line: where the engine runs."""
        return [("engine", "local (a copy of the policy in the trainer's process)")]
