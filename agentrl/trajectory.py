"""The episode record every layer shares: the task to play, the token record of a conversation,
and the finished trajectory with its typed outcome.

It sits at the bottom of the package (it imports nothing of agentrl): agents write it, the
collector completes it, the trainer packs it, envs read it in their eval baselines.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    baseline: bool = False  # a greedy episode played for its reward only: its group's ReMax baseline
    # Who plays a game's other roles (an env with two or more `roles`): "" the policy itself, in
    # every role (self-play); "random" the env's random legal player (`sample_action`), the policy
    # then playing one seat, `roles[group_id % len(roles)]` (evaluation against a fixed opponent).
    opponent: str = ""


@dataclass
class TokenRecord:
    """One episode's growing token sequence, turn by turn: ids we wrote (loss mask 0) and ids
    the engine generated (mask 1, with their behaviour logprobs and policy versions), and one
    reward per turn placed on the turn's last generated id."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # policy version per id, -1 where not generated
    rewards: list[float] = field(default_factory=list)  # one per turn
    reward_positions: list[int] = field(default_factory=list)  # last generated id of each turn

    def append_prompt(self, ids: Sequence[int]) -> None:
        """Append ids we wrote (template text, observations): no loss, no logprob."""
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.versions.extend([-1] * len(ids))

    def append_generated(self, ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]) -> None:
        """Append a turn's generated ids exactly as the engine produced them, and open its reward
        (0 until `set_turn_reward`), placed on its last id (the previous turn's for an empty reply)."""
        self.token_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)
        self.versions.extend(versions)
        self.reward_positions.append(len(self.token_ids) - 1 if ids else (self.reward_positions or [-1])[-1])
        self.rewards.append(0.0)

    def set_turn_reward(self, reward: float) -> None:
        """Record the env's reward for the latest turn."""
        if not self.rewards:
            raise AssertionError("set_turn_reward before any completion")
        self.rewards[-1] = float(reward)

    def add_turn_reward(self, reward: float) -> None:
        """Add a reward to the latest turn's (an env step after a turn's reply)."""
        if not self.rewards:
            raise AssertionError("add_turn_reward before any completion")
        self.rewards[-1] += float(reward)

    def set_rewards(self, rewards: Sequence[float]) -> None:
        """Replace every turn's reward at once (an agent's own reward shaping, one per turn)."""
        if len(rewards) != len(self.rewards):
            raise AssertionError(f"{len(rewards)} rewards for {len(self.rewards)} turns")
        self.rewards[:] = [float(r) for r in rewards]

    def truncate(self, length: int) -> None:
        """Drop the ids past `length`; they must all be ids we wrote (no reply is ever dropped)."""
        assert sum(self.loss_mask[length:]) == 0, "truncate would drop generated ids"
        for seq in (self.token_ids, self.loss_mask, self.logprobs, self.versions):
            del seq[length:]

    @property
    def num_generated(self) -> int:
        """Ids the policy generated so far."""
        return int(sum(self.loss_mask))


@dataclass
class Trajectory:
    """One episode as one token sequence, and how it ended.

    `token_ids`, `loss_mask`, `logprobs` and `versions` are aligned: `loss_mask` is 1 exactly on
    ids the engine generated, `logprobs` holds the behaviour logprob there (0 elsewhere), and
    `versions` the policy version that produced each id (-1 elsewhere). `rewards[k]` is the env's
    reward for turn k, placed at token index `reward_positions[k]` (that turn's last generated id).
    `turn_states[k]` identifies the env state turn k started from (its observation text), so
    that step-level baselines can compare turns taken from the same state.

    The outcome is typed: `success`, `terminated` (the env ended the episode; otherwise it was
    truncated, and `truncation_reason` says why: `env`, `max_turns`, `context` or
    `token_budget`), the agent's counts of `invalid_actions` and `truncated_replies`; the
    collector fills `tag` (the env definition played) and `reset_info` (what the env's reset
    returned as info: the layout and optimum its eval baselines read). `info` keeps the env's
    free-form extras, and `info["metrics"]`: numbers averaged per tag into the logs.
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
    success: bool = False
    terminated: bool = False
    truncation_reason: str | None = None
    invalid_actions: int = 0  # replies the env could not parse as an action
    truncated_replies: int = 0  # replies cut off at their token limit
    tag: str = ""
    reset_info: dict[str, Any] = field(default_factory=dict)
    baseline: bool = False  # played for its reward only (ReMax's greedy rollout): never trained
    reward_baseline: float | None = None  # its group's greedy-rollout reward (ReMax), when one was played
    # Index of this sequence in its episode: an agent may play an episode as several sequences (a
    # history window, a history rewrite). Segment 0 stands for the episode in episode-level
    # stats: its return is the episode's (each segment carries the rewards of those after it).
    segment: int = 0
    # The role this sequence played in a game of several roles (agents/game.py: one trajectory per
    # role, each its own conversation); "" for an env without roles. Advantage groups are per
    # (group, role): a seat of a game is compared with the same seat.
    role: str = ""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        assert len(self.loss_mask) == n and len(self.logprobs) == n and len(self.versions) == n, (
            "trajectory fields must be aligned with token_ids"
        )
        assert len(self.rewards) == len(self.reward_positions), "one reward position per turn"

    @classmethod
    def from_record(cls, record: TokenRecord, task: Task, turn_states: list[str], **outcome: Any) -> Trajectory:
        """The trajectory of `task` built from its token record; `outcome`: the typed fields and `info`."""
        return cls(record.token_ids, record.loss_mask, record.logprobs, record.versions, record.rewards,
                   record.reward_positions, task.group_id, task.env_seed, turn_states=turn_states,
                   tag=task.tag, **outcome)

    @property
    def truncated(self) -> bool:
        """True when the episode ended without the env terminating it."""
        return not self.terminated

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
