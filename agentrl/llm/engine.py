"""The inference-engine contract: token ids in, token ids and logprobs out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol


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
