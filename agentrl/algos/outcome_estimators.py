"""Episode-level estimators under verl's names: opo, grpo_passk, gpg, remax; and rae (SPIRAL).

Same input record and contract as `agentrl.algos.advantages` (read its docstring): (B, T)
float32 advantages and returns, zero where response_mask is 0. These four are outcome estimators in
verl: one score per episode, every generated id of the episode gets its advantage.

Score of an episode: its reward sum (credit token/outcome, as verl), or under credit=turn its
discounted return from its first turn G_1 (gamma per turn; with gamma=1 the reward sum); there
is no per-turn baseline here, unlike grpo/rloo under turn credit.

- opo (Hao et al. 2025, On-Policy RL with Optimal reward baseline, arXiv 2505.23585; verl
  compute_opo_outcome_advantage): score minus the length-weighted mean score of its group,
  sum_j |o_j| s_j / sum_j |o_j|, |o| the episode's generated-id count. Group of one: baseline 0.
- grpo_passk (Chen et al. 2025, arXiv 2503.19595; verl compute_grpo_passk_outcome_advantage):
  only the group's best episode gets an advantage, (r_max - r_second) / (std + eps) (or not
  divided when norm_adv_by_std_in_grpo=false), every other gets 0. Needs two or more episodes
  per group (verl raises too). Ties: the first of the best rows, whose advantage is then 0.
- gpg (Chu et al. 2025, GPG, arXiv 2504.02546; verl compute_gpg_outcome_advantage):
  alpha * (score - group mean), alpha = batch size / number of episodes with a non-zero score
  (verl's f_norm = 1). Group of one: mean 0.
- remax (Li et al. 2023, ReMax, arXiv 2310.10505; verl compute_remax_outcome_advantage):
  A_t = R_t - b with R_t the reward-to-go (verl: reverse cumulative sum of the masked rewards,
  no discount; under turn credit the turn return G_k) and b the reward of a greedy rollout of
  the same task, as verl: `remax.greedy_baseline = True` makes the run play one greedy episode
  per group (same env seed; it is not trained) and pass its reward sum as `reward_baselines`.
  Called without baselines (a row with NaN, or None), b falls back to the mean score of the
  group's other episodes (independent of the episode, hence still unbiased; 0 for a group of
  one). `remax_advantages` is verl's formula exactly (masked to generated ids).
- rae (Liu et al. 2025, SPIRAL's role-conditioned advantage estimation, arXiv 2506.24119): score
  minus the running average of the scores of the same game and role (`RoleBaselines`;
  `rae.role_baselines = True` makes the trainer keep the averages, `algorithm.rae_alpha`, and pass
  them as `role_baselines`). Not normalised by a std, as SPIRAL. A row outside any game has the
  role "", so for a one-role env rae is a running-mean baseline per env tag. In a zero-sum game
  the seats do not win equally often (the first player of Tic Tac Toe wins more), so a baseline
  per seat takes that role's bias out of the gradient of a policy that plays every seat. For each
  trajectory, in batch order, its key's baseline moves first, b <- alpha * b + (1 - alpha) * R,
  and the trajectory is scored against the moved baseline, A = R - b (SPIRAL's update, alpha =
  0.95 there); a key's first baseline starts from 0. An episode played as several sequences (a
  history window: one per turn) moves it once, with its first sequence; the others read it. The
  averages are a checkpoint's: a resumed run continues them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl.algos.estimator import Estimate, EstimatorInput
from agentrl.algos.returns import EPS, group_stats, turn_returns
from agentrl.config import AlgorithmConfig
from agentrl.registry import register_estimator


def episode_scores(token_rewards: torch.Tensor, response_mask: torch.Tensor, config: AlgorithmConfig) -> torch.Tensor:
    """(B,) score of each episode: reward sum, or under credit=turn G_1 (0 without generated ids)."""
    if config.credit != "turn":
        return token_rewards.sum(dim=-1)
    returns = turn_returns(token_rewards, response_mask, config.gamma)
    has = (response_mask > 0).any(dim=-1)
    first = (response_mask > 0).float().argmax(dim=-1)
    first_return = returns.gather(1, first.unsqueeze(1)).squeeze(1)
    return torch.where(has, first_return, torch.zeros_like(first_return))


def _groups(index: torch.Tensor) -> torch.Tensor:
    inverse: torch.Tensor = torch.unique(index, return_inverse=True)[1]  # torch.unique is untyped (Any)
    return inverse


def _spread(per_episode: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    adv = per_episode.unsqueeze(-1) * response_mask
    return adv, adv


@register_estimator("opo")
def opo(x: EstimatorInput) -> Estimate:
    """OPO: score minus the group's length-weighted mean score (0 for a group of one), (B, T)."""
    scores = episode_scores(x.token_rewards, x.response_mask, x.config)
    lengths = x.response_mask.sum(dim=-1)
    group = _groups(x.index)
    size = int(group.max()) + 1 if group.numel() else 0
    count = torch.zeros(size, dtype=scores.dtype).index_add_(0, group, torch.ones_like(scores))
    weighted = torch.zeros(size, dtype=scores.dtype).index_add_(0, group, lengths * scores)
    total = torch.zeros(size, dtype=scores.dtype).index_add_(0, group, lengths)
    baseline = torch.where((count > 1) & (total > 0), weighted / total.clamp(min=1e-12), torch.zeros_like(total))
    return _spread(scores - baseline[group], x.response_mask)


@register_estimator("grpo_passk")
def grpo_passk(x: EstimatorInput) -> Estimate:
    """Pass@k GRPO: the group's best episode gets (r_max - r_second) [/ (std + eps)], others 0."""
    scores = episode_scores(x.token_rewards, x.response_mask, x.config)
    group = _groups(x.index)
    out = torch.zeros_like(scores)
    for g in range(int(group.max()) + 1 if group.numel() else 0):
        rows = (group == g).nonzero(as_tuple=True)[0]
        if rows.numel() < 2:
            raise ValueError(f"grpo_passk needs at least 2 episodes per group, group {int(x.index[rows[0]])} has "
                             f"{rows.numel()}: set rollout.group_size >= 2")
        s = scores[rows]
        best = int(torch.argmax(s))  # the first of the best rows
        top2 = torch.topk(s, 2).values
        adv = top2[0] - top2[1]
        out[rows[best]] = adv / (s.std() + EPS) if x.config.norm_adv_by_std_in_grpo else adv
    return _spread(out, x.response_mask)


@register_estimator("gpg")
def gpg(x: EstimatorInput) -> Estimate:
    """GPG: alpha * (score - group mean), alpha = batch size / episodes with non-zero score, (B, T)."""
    scores = episode_scores(x.token_rewards, x.response_mask, x.config)
    group = _groups(x.index)
    count, mean, _ = group_stats(scores, group)
    baseline = torch.where(count[group] > 1, mean[group], torch.zeros_like(scores))
    alpha = scores.numel() / max(int(torch.count_nonzero(scores)), 1)
    return _spread(alpha * (scores - baseline), x.response_mask)


def remax_advantages(token_rewards: torch.Tensor, response_mask: torch.Tensor,
                     reward_baselines: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ReMax: reward-to-go R_t (masked rewards, undiscounted) minus the (B,) baseline, (B, T)."""
    returns = (token_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1]) * response_mask
    return (returns - reward_baselines.unsqueeze(-1)) * response_mask, returns


@register_estimator("remax")
def remax(x: EstimatorInput) -> Estimate:
    """ReMax: return minus the group's greedy-rollout reward (the leave-one-out mean score where a
    row has none), (B, T)."""
    scores = episode_scores(x.token_rewards, x.response_mask, x.config)
    group = _groups(x.index)
    count, mean, _ = group_stats(scores, group)
    n = count[group]
    baseline = torch.where(n > 1, (mean[group] * n - scores) / (n - 1).clamp(min=1), torch.zeros_like(scores))
    if x.reward_baselines is not None:
        greedy = x.reward_baselines.to(scores.dtype)
        baseline = torch.where(torch.isnan(greedy), baseline, greedy)
    if x.config.credit == "turn":
        returns = turn_returns(x.token_rewards, x.response_mask, x.config.gamma)
        return (returns - baseline.unsqueeze(-1)) * x.response_mask, returns
    return remax_advantages(x.token_rewards, x.response_mask, baseline)


# The run plays one greedy episode per group for it (verl): a flag on the function, which
# `uses_greedy_baseline` reads and a function's type does not declare.
remax.greedy_baseline = True  # type: ignore[attr-defined]


@register_estimator("rae")
def rae(x: EstimatorInput) -> Estimate:
    """RAE: score minus the running baseline of the row's game and role, on every generated id, (B, T)."""
    if x.role_baselines is None:
        raise ValueError("adv_estimator=rae needs role_baselines (the trainer keeps them per game and role; "
                         "a caller of compute_advantages passes them in EstimatorInput.role_baselines)")
    scores = episode_scores(x.token_rewards, x.response_mask, x.config)
    return _spread(scores - x.role_baselines.to(scores.dtype), x.response_mask)


# The trainer keeps a running baseline per (game, role) for it: a flag `uses_role_baselines` reads.
rae.role_baselines = True  # type: ignore[attr-defined]


class RoleBaselines:
    """An exponential moving average of the return per key (a game's tag and a role)."""

    def __init__(self, alpha: float = 0.95) -> None:
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"algorithm.rae_alpha={alpha!r}: expected a number in [0, 1)")
        self.alpha = alpha
        self.values: dict[str, float] = {}

    def update(self, keys: Sequence[str], returns: torch.Tensor, moves: Sequence[bool] | None = None) -> torch.Tensor:
        """Each row's baseline after its own return moved its key's average, (B,) float32.
        `moves[i]` False: row i does not move it and reads the average as it stands (a later
        sequence of an episode, after its first: one game moves its seat's average once)."""
        out = torch.empty(len(keys), dtype=torch.float32)
        for i, (key, r) in enumerate(zip(keys, returns.tolist())):
            b = self.values.get(key, 0.0)
            if moves is None or moves[i]:
                b = self.values[key] = self.alpha * b + (1.0 - self.alpha) * float(r)
            out[i] = b
        return out

    def metrics(self) -> dict[str, float]:
        """`reward/rae_baseline/<key>` of every key seen."""
        return {f"reward/rae_baseline/{key}": value for key, value in sorted(self.values.items())}

    def state_dict(self) -> dict[str, float]:
        """The averages, for a checkpoint."""
        return dict(self.values)

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Continue from `state_dict`'s averages."""
        self.values = {str(k): float(v) for k, v in state.items()}
