"""The pieces the advantage estimators share: turns and their returns, group statistics, whitening.

Shapes as in every estimator (agentrl/algos/advantages.py): (B, T) per token, `response_mask`
1 on the ids the policy generated; a turn is a run of generated ids.
"""

from __future__ import annotations

import torch

EPS = 1e-6  # added to a group's std (verl)


def turn_ends(response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the last generated id of each turn (mask 1 followed by 0 or the end)."""
    mask = response_mask > 0
    after = torch.nn.functional.pad(mask[:, 1:], (0, 1), value=False)
    return mask & ~after


def turn_ids(response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) int64: 1 + index of the agent turn each position belongs to (0 before the first).

    Positions after a turn's last generated id (observations) count for that turn, so a reward
    placed there is that turn's reward.
    """
    mask = response_mask > 0
    before = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)
    return (mask & ~before).long().cumsum(dim=1)


def turn_returns(token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, T): each generated token gets its turn's discounted return G_k = r_k + gamma G_{k+1}."""
    ids = turn_ids(response_mask)
    n_turns = int(ids.max()) if ids.numel() else 0
    per_turn = torch.zeros(ids.shape[0], n_turns + 1, dtype=token_rewards.dtype)
    per_turn.scatter_add_(1, ids, token_rewards)
    returns = torch.zeros_like(per_turn)
    running = torch.zeros(ids.shape[0], dtype=token_rewards.dtype)
    for k in range(n_turns, 0, -1):
        running = per_turn[:, k] + gamma * running
        returns[:, k] = running
    return returns.gather(1, ids) * response_mask


class TurnDepths:
    """The turn ends of a batch keyed by (group, turn number): the baseline groups of turn credit.

    Turn k of an episode is compared with turn k of the other episodes of its group. Pooling all
    turns of a group instead would score early turns above late ones whatever was played (with
    shaping rewards an episode's returns fall turn by turn), and keep pushing down the last
    moves of a group that already solves the task. A turn that no other episode of its group
    reached has nothing to be compared with: `lone` marks it, and the estimators give it 0 (in a
    group of one sequence, every turn keeps its raw return, as verl's group of one).
    """

    def __init__(self, returns: torch.Tensor, response_mask: torch.Tensor, index: torch.Tensor) -> None:
        self.ids = turn_ids(response_mask)
        self.mask = response_mask
        self.rows, cols = turn_ends(response_mask).nonzero(as_tuple=True)
        self.depth = self.ids[self.rows, cols]
        _, group = torch.unique(index, return_inverse=True)
        width = int(self.ids.max()) + 1 if self.ids.numel() else 1
        _, self.key = torch.unique(group[self.rows] * width + self.depth, return_inverse=True)
        self.scores = returns[self.rows, cols]
        self.width = width
        members = torch.bincount(group)[group[self.rows]]  # sequences in each turn end's group
        count = torch.bincount(self.key)[self.key]
        self.lone = (count == 1) & (members > 1)

    def drop_lone(self, per_turn: torch.Tensor) -> torch.Tensor:
        """`per_turn` (N,) with the lone turns' entries set to 0 (see the class docstring)."""
        return torch.where(self.lone, torch.zeros_like(per_turn), per_turn)

    def spread(self, per_turn: torch.Tensor) -> torch.Tensor:
        """Per-turn-end values (N,) back onto every generated id of their turn, (B, T)."""
        table = torch.zeros(self.mask.shape[0], self.width, dtype=per_turn.dtype)
        table[self.rows, self.depth] = per_turn
        return table.gather(1, self.ids) * self.mask


def group_stats(values: torch.Tensor, ids: torch.Tensor,
                size: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-id count, mean and unbiased std of `values` (N,) with ids (N,) in [0, size)."""
    size = int(ids.max()) + 1 if size is None and ids.numel() else (size or 0)
    count = torch.zeros(size, dtype=values.dtype).index_add_(0, ids, torch.ones_like(values))
    mean = torch.zeros(size, dtype=values.dtype).index_add_(0, ids, values) / count.clamp(min=1)
    sq = torch.zeros(size, dtype=values.dtype).index_add_(0, ids, (values - mean[ids]) ** 2)
    return count, mean, torch.sqrt(sq / (count - 1).clamp(min=1))


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(values - mean) / sqrt(unbiased var + 1e-8) over masked entries (verl); 0 if < 2 entries."""
    n = mask.sum()
    if n < 2:
        return torch.zeros_like(values)
    mean = (values * mask).sum() / (n + 1e-8)
    var = (((values - mean) ** 2) * mask).sum() / (n + 1e-8) * (n / (n - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)
