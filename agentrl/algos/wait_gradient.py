"""The exact expected update of a wait-or-go policy: the reference the turn-credit analysis rests on.

The game is the `wait_walk` env's (agentrl/envs/wait_walk.py) reduced to a table: at every turn the
policy picks `wait`, `right` (the goal: reward 1, the episode ends) or `left` (the hole: reward 0,
it ends) from one softmax over logits (3,) float64; on the last of `horizon` turns `wait` is not
offered (softmax over right and left). Waiting never changes what can be earned: the success
probability is pi_right / (pi_right + pi_left) whatever pi_wait is, so the true gradient's wait
component is exactly 0, and an estimator whose expected update has a non-zero wait component
pushes the policy towards (> 0) or away from (< 0) waiting for no reason.

`expected_update` enumerates every group of `group_size` episodes (each of the 2 * horizon
episodes: m waits, then right or left), runs the registered estimator on them as a packed batch
(one generated id and one observation id per turn, the reward on the last generated id), weighs
each token's score by the loss aggregation's own weights (`aggregate` over one group as the
mini-batch), and sums with the groups' probabilities. No sampling: the result is exact.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from agentrl.algos.advantages import compute_advantages
from agentrl.algos.estimator import EstimatorInput
from agentrl.algos.losses import aggregate
from agentrl.config import AlgorithmConfig

WAIT, RIGHT, LEFT = 0, 1, 2


def episodes(horizon: int) -> list[list[int]]:
    """Every episode of the game: m waits (m < horizon), then right or left."""
    return [[WAIT] * m + [move] for m in range(horizon) for move in (RIGHT, LEFT)]


def _policies(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pi, pi on the last turn, where wait is not offered), each (3,) float64."""
    pi = torch.softmax(logits, 0)
    last = pi.clone()
    last[WAIT] = 0.0
    return pi, last / last.sum()


def true_gradient(logits: torch.Tensor, horizon: int) -> torch.Tensor:
    """d P(success) / d logits, (3,) float64 (its wait component is 0)."""
    theta = logits.detach().clone().requires_grad_(True)
    pi, last = _policies(theta)
    success = sum(pi[WAIT] ** m * pi[RIGHT] for m in range(horizon - 1)) + pi[WAIT] ** (horizon - 1) * last[RIGHT]
    (grad,) = torch.autograd.grad(success, theta)
    return grad


def expected_update(config: AlgorithmConfig, logits: torch.Tensor, horizon: int = 3, group_size: int = 4,
                    loss_agg_mode: str = "seq-mean-token-sum", same_state: bool = True) -> torch.Tensor:
    """E[-d loss / d logits] of one group of episodes under `config`'s estimator and credit, (3,) float64.

    `same_state`: every turn starts from one env state (a wait leaves the observation as it was:
    GiGPO puts an episode's turns in one anchor group); False gives each turn number its own."""
    pi, last_pi = _policies(logits.double())
    games = episodes(horizon)
    p_game = torch.tensor([float(torch.prod(pi[torch.tensor(g[:-1], dtype=torch.long)]))
                           * float((last_pi if len(g) == horizon else pi)[g[-1]]) for g in games], dtype=torch.float64)
    groups = list(itertools.product(range(len(games)), repeat=group_size))
    rows, width = len(groups) * group_size, 2 * horizon
    rewards, mask = torch.zeros(rows, width), torch.zeros(rows, width)
    moves = torch.full((rows, width), -1, dtype=torch.long)
    state_ids = torch.full((rows, width), -1, dtype=torch.long)
    index = torch.arange(len(groups)).repeat_interleave(group_size)
    for row, game in enumerate(g for group in groups for g in group):
        for k, move in enumerate(games[game]):
            mask[row, 2 * k], moves[row, 2 * k] = 1.0, move
            state_ids[row, 2 * k] = int(index[row]) * horizon + (0 if same_state else k)
        rewards[row, 2 * (len(games[game]) - 1)] = float(games[game][-1] == RIGHT)
    adv, _ = compute_advantages(config.adv_estimator, EstimatorInput(rewards, mask, index, None, config, state_ids))
    # d log pi(move) / d logits at every generated id: onehot(move) - pi (the last turn's pi there)
    score = torch.zeros(rows, width, 3, dtype=torch.float64)
    on = moves >= 0
    score[on] = torch.nn.functional.one_hot(moves[on], 3).double() - pi
    final = on.clone()
    final[:, : 2 * (horizon - 1)] = False
    score[final] = torch.nn.functional.one_hot(moves[final], 3).double() - last_pi
    weights = torch.zeros(rows, width, dtype=torch.float64)  # d aggregate / d token loss, per group
    for g in range(len(groups)):
        part = slice(g * group_size, (g + 1) * group_size)
        loss = torch.zeros(group_size, width, requires_grad=True)
        (weights[part],) = torch.autograd.grad(aggregate(loss, mask[part], loss_agg_mode, horizon=width), loss)
    per_group = (weights * adv.double()).unsqueeze(-1).mul(score).sum(dim=1)  # (rows, 3)
    per_group = per_group.view(len(groups), group_size, 3).sum(1)
    p_group = p_game[torch.tensor(groups)].prod(dim=1)
    return (p_group.unsqueeze(1) * per_group).sum(0)


def wait_bias(config: AlgorithmConfig, logits: torch.Tensor, **kwargs: Any) -> float:
    """The expected update's wait component over its right component: 0 for an estimator that is
    indifferent to waiting, > 0 when it teaches the policy to wait, < 0 when it teaches it not to."""
    update = expected_update(config, logits, **kwargs)
    return float(update[WAIT] / update[RIGHT])
