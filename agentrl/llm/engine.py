"""The inference-engine contract: token ids in, token ids and logprobs out.

Two Protocols: `LLMClient`, the one method agents call, and `InferenceEngine`, what the
trainer's side (the rollout source) needs to serve a run: weights in, a policy version out,
metrics, a resumable state, and a way to drop cached prefixes. `LocalEngine` (llm/local/engine.py)
implements both in this process; an engine behind HTTP or on Ray implements the same methods.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

# The episode a `generate` call serves. Engines that route by episode (remote: sticky servers)
# and demo clients read it through `episode_key()`; a caller that generates for an episode from
# another task (a session's HTTP handler) sets it, since the asyncio task is then not the episode's.
EPISODE: ContextVar[object | None] = ContextVar("agentrl_episode", default=None)


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 16
    greedy: bool = False
    stop_token_ids: tuple[int, ...] = ()  # generation ends with (and includes) any of these ids
    stop: tuple[str, ...] = ()  # generation ends with the id that completes any of these strings
    seed: int | None = None  # per-request seed: same seed and prompt, same output


FinishReason = Literal["stop", "length", "abort"]


@dataclass
class Completion:
    """What the engine produced for one request."""

    token_ids: list[int]
    logprobs: list[float]  # log p(token) under the temperature-scaled policy, one per token
    finish_reason: FinishReason  # stop: EOS/stop id/stop string generated (and included); length: budget hit
    policy_version: int = 0  # version of the weights that produced the last id
    versions: list[int] = field(default_factory=list)  # policy version that produced each id
    stop_reason: int | str | None = None  # the stop id or string that ended it (None for EOS, length, abort)
    kv_version: int | None = None  # oldest weights version among the cached keys/values it attended to


class LLMClient(Protocol):
    """What agents call: one async method."""

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """Continue `prompt_ids`; return the new ids exactly as produced."""
        ...


@runtime_checkable
class InferenceEngine(Protocol):
    """An engine a run can train against: it generates, takes new weights, and can be resumed.

    Every method but `generate` is called from one thread at a time, between two of the
    engine's steps (the rollout source sees to it)."""

    policy_version: int  # version of the weights it serves; each load_weights adds one

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """Continue `prompt_ids`; return the new ids exactly as produced."""
        ...

    def load_weights(self, state_dict: dict[str, Any]) -> int:
        """Serve these weights from the next step on; return the new policy version.

        `state_dict` is the policy's full state dict, or with LoRA an adapter state: the adapter
        tensors under peft's saved names plus one non-tensor entry, `agentrl.models.lora.ADAPTER_CONFIG`,
        holding the peft config as a dict (together: a peft adapter folder's contents)."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix (vLLM's name); False, and nothing changed, while requests run."""
        ...

    def pop_metrics(self) -> dict[str, float]:
        """perf/engine_* counters since the last call, then reset them."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to continue (policy version, seed stream)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        ...

    def close(self) -> None:
        """End every request and release the engine's resources."""
        ...


def episode_key() -> object | None:
    """The episode the running `generate` call serves: EPISODE if set, else the current task."""
    key = EPISODE.get()
    if key is not None:
        return key
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop
        return None
