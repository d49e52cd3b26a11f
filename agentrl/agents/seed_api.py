"""The seeds' (AReaL legacy) agent-side names: the base class and the data that crosses the queues.

`Agent` is the base a seed-style agent subclasses (`class MathMultiTurnAgent(Agent)`);
`SequenceSample` is its prompt (and what it may return), `GenerationHyperparameters` its
gconfig, `BundledGenerationOutputs` what `act_queue` delivers. `is_seed_agent` tells such a class
from one written to our own contract (`agents/base.py`). compat.py runs them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.agents import base


@dataclass(frozen=True)
class GenerationConfig:
    """The generation settings a seed agent passes back with each request (AReaL's
    GenerationHyperparameters); `min_new_tokens` is accepted and not enforced."""

    n: int = 1
    max_new_tokens: int = 16
    min_new_tokens: int = 0
    greedy: bool = False
    top_p: float = 1.0
    top_k: int = -1
    temperature: float = 1.0

    def new(self, **changes: Any) -> GenerationConfig:
        """A copy with some fields changed (AReaL's `gconfig.new(n=1)`)."""
        return replace(self, **changes)


@dataclass
class SequenceSample:
    """The parts of AReaL's SequenceSample that agents read and build: `ids` (one query id per
    sequence), `data` (name -> values; the prompt's `packed_prompts` is a list of ids, not a
    tensor), `seqlens` and `metadata`. The prompt of `collect_trajectory` is one of these."""

    ids: list[str]
    data: dict[str, Any] = field(default_factory=dict)
    seqlens: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_default(cls, ids: Sequence[str], data: Mapping[str, Any], seqlens: Any = None,
                     metadata: Mapping[str, Any] | None = None, **_: Any) -> SequenceSample:
        """AReaL's constructor (the remaining arguments are accepted and unused)."""
        return cls(list(ids), dict(data), dict(seqlens) if isinstance(seqlens, Mapping) else {},
                   dict(metadata or {}))

    @classmethod
    def prompt(cls, qid: str, token_ids: list[int], text: str) -> SequenceSample:
        """The prompt of one episode."""
        return cls([qid], {"packed_prompts": list(token_ids)}, {"packed_prompts": [[len(token_ids)]]},
                   {"text": text})

    @property
    def bs(self) -> int:
        return len(self.ids)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.data)

    @property
    def qid(self) -> str:
        return self.ids[0]

    @property
    def token_ids(self) -> list[int]:
        return list(self.data.get("packed_prompts", []))

    @property
    def text(self) -> str:
        return str(self.metadata.get("text", ""))


SeedPrompt = SequenceSample  # the name this module used before


@dataclass
class GenerationOutput:
    """One generation, as `act_queue` delivers it (AReaL's BundledGenerationOutputs with n=1;
    `logprobs` cover the output ids only)."""

    qid: str
    prompt_ids: list[int]
    output_ids: list[list[int]]
    seqs: list[list[int]]
    logprobs: list[list[float]]
    no_eos: list[bool]
    version_start: list[int]
    version_end: list[int]

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def seqlens(self) -> list[int]:
        return [len(s) for s in self.seqs]


BundledGenerationOutputs = GenerationOutput  # AReaL's name for what act_queue delivers
GenerationHyperparameters = GenerationConfig  # AReaL's name for the gconfig


class Agent:
    """Base of a seed-style (AReaL legacy) agent: override `collect_trajectory`.

    Not our own contract (`agentrl.agents.base.Agent`, one `run_episode`): a subclass of this
    class always runs through `SeedAgentAdapter`."""

    async def collect_trajectory(self, prompt: SequenceSample, env: Any, obs_queue: asyncio.Queue,
                                 act_queue: asyncio.Queue) -> Any:
        """Play one episode through the queues; return the samples built (or None)."""
        raise NotImplementedError(f"{type(self).__name__} must define async collect_trajectory(self, prompt, env, "
                                  "obs_queue, act_queue)")


def is_seed_agent(cls: Any) -> bool:
    """Whether a registered agent class speaks the seeds' queue API rather than ours: a subclass
    of the seed `Agent`, or a class with `collect_trajectory` whose `run_episode` (if any) is
    only our contract's Protocol stub."""
    if isinstance(cls, type) and issubclass(cls, Agent):
        return True
    if not hasattr(cls, "collect_trajectory"):
        return False
    own = getattr(cls, "run_episode", None)
    return own is None or own is getattr(base.Agent, "run_episode", None)
