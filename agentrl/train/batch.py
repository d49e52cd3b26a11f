"""Pack trajectories into right-padded tensors: the one place where padding happens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from agentrl.trajectory import Trajectory


@dataclass
class Batch:
    """A training batch; every (B, T) tensor is aligned with `input_ids`."""

    input_ids: torch.Tensor  # (B, T) int64, right-padded
    attention_mask: torch.Tensor  # (B, T) int64
    loss_mask: torch.Tensor  # (B, T) float32, 1 on generated ids
    behaviour_logprobs: torch.Tensor  # (B, T) float32, the engine's logprobs on generated ids
    token_rewards: torch.Tensor  # (B, T) float32, each turn's reward at its last generated id
    versions: torch.Tensor  # (B, T) int64, policy version per generated id (-1 elsewhere)
    group_index: torch.Tensor  # (B,) int64
    state_ids: torch.Tensor  # (B, T) int64, id of (group, state a turn started from); -1 off-turn
    old_logprobs: torch.Tensor | None = None  # (B, T) trainer's logprobs before the update
    ref_logprobs: torch.Tensor | None = None  # (B, T) frozen reference policy's logprobs
    values: torch.Tensor | None = None  # (B, T) critic values before the update
    advantages: torch.Tensor | None = None  # (B, T)
    returns: torch.Tensor | None = None  # (B, T)
    reward_baselines: torch.Tensor | None = None  # (B,) float32, the group's greedy-rollout reward (ReMax); NaN: none
    episode_index: torch.Tensor | None = None  # (B,) int64, the episode of each row (several when an agent segments)
    truncated: torch.Tensor | None = None  # (B,) bool, the row's episode ended truncated (any truncation_reason)

    @property
    def size(self) -> int:
        """Number of sequences."""
        return int(self.input_ids.shape[0])

    def select(self, idx: torch.Tensor | slice) -> Batch:
        """The sub-batch of rows `idx`, trimmed to its longest sequence."""
        parts: dict[str, Any] = {}
        for f in fields(self):
            t = getattr(self, f.name)
            parts[f.name] = t[idx] if t is not None else None
        width = int(parts["attention_mask"].sum(-1).max().item()) if parts["input_ids"].numel() else 0
        for name, t in parts.items():
            if t is not None and t.dim() == 2:
                parts[name] = t[:, :width]
        return replace(self, **parts)

    def to(self, device: torch.device | str) -> Batch:
        """Move every tensor to `device`."""
        moved: dict[str, Any] = {f.name: (getattr(self, f.name).to(device) if getattr(self, f.name) is not None
                                          else None) for f in fields(self)}
        return replace(self, **moved)


def need(t: torch.Tensor | None, name: str) -> torch.Tensor:
    """A batch field that an earlier stage of the step sets (`name`: its field name), or a clear error."""
    if t is None:
        raise RuntimeError(f"batch.{name} is not set: the stage of the step that computes it has not run")
    return t


def pack(trajectories: Sequence[Trajectory], pad_token_id: int) -> Batch:
    """Right-pad trajectories into a Batch; group ids are renumbered 0..G-1 in order seen."""
    if not trajectories:
        raise ValueError("pack() needs at least one trajectory")
    width = max(len(t.token_ids) for t in trajectories)
    n = len(trajectories)
    ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width))
    logp = torch.zeros((n, width))
    rewards = torch.zeros((n, width))
    versions = torch.full((n, width), -1, dtype=torch.long)
    state_ids = torch.full((n, width), -1, dtype=torch.long)
    states: dict[tuple[int, str, str], int] = {}
    groups: dict[tuple[int, str], int] = {}
    index = torch.zeros(n, dtype=torch.long)
    episode = torch.cumsum(torch.tensor([t.segment == 0 or i == 0 for i, t in enumerate(trajectories)]), 0) - 1
    for i, t in enumerate(trajectories):
        k = len(t.token_ids)
        ids[i, :k] = torch.tensor(t.token_ids, dtype=torch.long)
        attn[i, :k] = 1
        mask[i, :k] = torch.tensor(t.loss_mask, dtype=torch.float32)
        logp[i, :k] = torch.tensor(t.logprobs, dtype=torch.float32)
        versions[i, :k] = torch.tensor(t.versions, dtype=torch.long)
        for pos, r in zip(t.reward_positions, t.rewards):
            if pos >= 0:
                rewards[i, pos] += float(r)  # an int beyond int64 is still a number the batch holds
        index[i] = groups.setdefault((t.group_id, t.role), len(groups))  # a game's seats: a group per role
        start = 0
        for pos, key in zip(t.reward_positions, t.turn_states):
            if pos >= start:
                state_ids[i, start:pos + 1] = states.setdefault((t.group_id, t.role, key), len(states))
                start = pos + 1
    # Position 0 can never be predicted (no context): keep it out of every loss.
    mask[:, 0] = 0.0
    state_ids[mask == 0] = -1
    baselines = None
    if any(t.reward_baseline is not None for t in trajectories):
        baselines = torch.tensor([float("nan") if t.reward_baseline is None else float(t.reward_baseline)
                                  for t in trajectories], dtype=torch.float32)
    truncated = torch.tensor([t.truncation_reason is not None for t in trajectories], dtype=torch.bool)
    return Batch(ids, attn, mask, logp, rewards, versions, index, state_ids, reward_baselines=baselines,
                 episode_index=episode, truncated=truncated)


def mini_batches(batch: Batch, episodes: int) -> list[torch.Tensor]:
    """Row indices of each mini-batch: `episodes` episodes each, with every row (segment) of
    them, so an agent that plays an episode as several sequences takes as many optimizer steps
    a training step as one that does not."""
    index = batch.episode_index if batch.episode_index is not None else torch.arange(batch.size)  # a row each
    chunk = index // episodes
    return [(chunk == c).nonzero(as_tuple=True)[0] for c in torch.unique(chunk).tolist()]


def micro_batches(attention_mask: torch.Tensor, rows: torch.Tensor, size: int, max_tokens: int = 0,
                  packed: bool = False) -> list[torch.Tensor]:
    """Split `rows` (indices into a batch) into the micro-batches of one forward/backward each.

    Without a token budget: `size` rows at a time, in order. With `max_tokens` > 0 (verl's dynamic
    batch size): rows longest first, each micro-batch filled while its cost stays within the budget
    (packed: the sum of its lengths; padded: its rows times the longest), so short episodes share
    a pass and long ones do not overflow memory; a row longer than the budget gets a pass of its
    own. Losses are normalised by the mini-batch's counts, so how rows are grouped never changes
    the gradient beyond float rounding.
    """
    if max_tokens <= 0 or not len(rows):
        return [rows[i:i + size] for i in range(0, len(rows), size)]
    lengths = attention_mask[rows].sum(-1).tolist()
    order = sorted(range(len(rows)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    current: list[int] = []
    total = longest = 0
    for i in order:
        n = lengths[i]
        cost = total + n if packed else max(longest, n) * (len(current) + 1)
        if current and cost > max_tokens:
            groups.append(current)
            current, total, longest = [], 0, 0
        current.append(i)
        total, longest = total + n, max(longest, n)
    groups.append(current)
    return [rows[torch.tensor(g, dtype=torch.long)] for g in groups]
