"""The typed record of one episode, handed from rollout to training."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Task:
    """One episode to run: which named env (tag), which env seed, which group, how to sample."""

    env_seed: int
    group_id: int
    sampling_seed: int
    greedy: bool = False
    tag: str = ""  # the env definition (custom_envs name) this episode plays; metrics go under it


@dataclass
class Trajectory:
    """One episode as one token sequence.

    `token_ids`, `loss_mask`, `logprobs` and `versions` are aligned: `loss_mask` is 1 exactly on
    ids the engine generated, `logprobs` holds the behaviour logprob there (0 elsewhere), and
    `versions` the policy version that produced each id (-1 elsewhere). `rewards[k]` is the env's
    reward for turn k, placed at token index `reward_positions[k]` (that turn's last generated id).
    `turn_states[k]` identifies the env state turn k started from (its observation text), so
    that step-level baselines can compare turns taken from the same state.
    """

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    rewards: list[float]
    reward_positions: list[int]
    group_id: int
    env_seed: int
    info: dict[str, Any] = field(default_factory=dict)
    turn_states: list[str] = field(default_factory=list)  # the observation each turn acted on

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        assert len(self.loss_mask) == n and len(self.logprobs) == n and len(self.versions) == n, (
            "trajectory fields must be aligned with token_ids"
        )
        assert len(self.rewards) == len(self.reward_positions), "one reward position per turn"

    @property
    def total_reward(self) -> float:
        """The episode's return (sum of per-turn rewards)."""
        return float(sum(self.rewards))

    @property
    def num_turns(self) -> int:
        """Agent turns taken."""
        return len(self.rewards)

    @property
    def num_generated(self) -> int:
        """Ids the policy generated."""
        return int(sum(self.loss_mask))
