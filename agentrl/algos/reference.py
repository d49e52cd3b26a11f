"""Plain-loop reference advantage estimators, used only by tests to check the vectorised ones.

Each public estimator here mirrors the one of the same name in `agentrl.algos.advantages`:
same input record, same semantics and the same edge cases as that module's docstring (its spec),
but written as explicit Python loops over rows and positions in Python floats, so that it can
be read against the spec line by line. Nothing in training imports this module.

Turns: a turn is a maximal run of generated ids (mask 1); the masked ids after a turn, up to
the next turn, belong to it, so a reward placed there is that turn's reward. Masked ids before
the first turn belong to no turn.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from agentrl.algos.estimator import Estimate, Estimator, EstimatorInput

EPS = 1e-6
WHITEN_EPS = 1e-8

Rows = list[list[float]]


# ---------------------------------------------------------------------------- small helpers
def _rows(x: torch.Tensor) -> Rows:
    """A (B, T) tensor as nested lists of Python floats."""
    return [[float(v) for v in row] for row in x.tolist()]


def _tensor(rows: Rows, like: torch.Tensor) -> torch.Tensor:
    """Nested lists back to a tensor with `like`'s shape and dtype."""
    return torch.tensor(rows, dtype=like.dtype).reshape(like.shape)


def _zeros(batch: int, width: int) -> Rows:
    """A (batch, width) matrix of zeros."""
    return [[0.0] * width for _ in range(batch)]


def turn_of(mask_row: list[float]) -> list[int]:
    """1 + index of the turn each position belongs to, 0 before the first turn."""
    out, turn, previous = [], 0, False
    for m in mask_row:
        generated = m > 0
        if generated and not previous:
            turn += 1
        out.append(turn)
        previous = generated
    return out


def turn_rewards(reward_row: list[float], mask_row: list[float]) -> list[float]:
    """Reward of each turn (index k - 1 for turn k): the sum of rewards at its positions."""
    turns = turn_of(mask_row)
    rewards = [0.0] * max(turns, default=0)
    for t, k in enumerate(turns):
        if k > 0:
            rewards[k - 1] += reward_row[t]
    return rewards


def turn_returns(reward_row: list[float], mask_row: list[float], gamma: float) -> list[float]:
    """Discounted return of each turn: G_k = r_k + gamma * G_{k+1}."""
    rewards = turn_rewards(reward_row, mask_row)
    returns = [0.0] * len(rewards)
    running = 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = rewards[k] + gamma * running
        returns[k] = running
    return returns


def turn_starts(mask_row: list[float]) -> list[int]:
    """Position of the first generated id of each turn."""
    turns = turn_of(mask_row)
    return [t for t in range(len(mask_row)) if mask_row[t] > 0 and (t == 0 or turns[t - 1] != turns[t])]


def groups(index: list[int]) -> dict[int, list[int]]:
    """Rows of each group id, in row order."""
    members: dict[int, list[int]] = {}
    for row, group in enumerate(index):
        members.setdefault(group, []).append(row)
    return members


def mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and unbiased std of a non-empty list (std 0 for a single value)."""
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def whiten(values: Rows, mask: Rows) -> Rows:
    """(v - mean) / sqrt(unbiased var + 1e-8) over the batch's generated ids; 0 if < 2 ids.

    verl's masked_whiten divides by (n + 1e-8) where this divides by n: in float32 the two are
    the same number, while in float64 the 1e-8 would leave a (v - mean) of about 1e-8 * v / n
    that the rsqrt(1e-8) of a constant batch turns into 1e-4 * v / n.
    """
    picked = [v for vrow, mrow in zip(values, mask) for v, m in zip(vrow, mrow) if m > 0]
    n = len(picked)
    out = _zeros(len(values), len(values[0]) if values else 0)
    if n < 2:
        return out
    mean = sum(picked) / n
    var = sum((v - mean) ** 2 for v in picked) / (n - 1)
    for b, (vrow, mrow) in enumerate(zip(values, mask)):
        for t, (v, m) in enumerate(zip(vrow, mrow)):
            if m > 0:
                out[b][t] = (v - mean) / math.sqrt(var + WHITEN_EPS)
    return out


def _spread(per_turn: Rows, mask: Rows) -> Rows:
    """Give every generated id its turn's value: per_turn[b][k - 1] at the ids of turn k."""
    out = _zeros(len(mask), len(mask[0]) if mask else 0)
    for b, mrow in enumerate(mask):
        for t, k in enumerate(turn_of(mrow)):
            if mrow[t] > 0:
                out[b][t] = per_turn[b][k - 1]
    return out


def outcome_rewards(token_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Each row's reward sum moved onto its last generated id (rows with none get zeros)."""
    rewards, mask = _rows(token_rewards), _rows(response_mask)
    out = _zeros(len(rewards), len(rewards[0]) if rewards else 0)
    for b, (rrow, mrow) in enumerate(zip(rewards, mask)):
        last = max((t for t, m in enumerate(mrow) if m > 0), default=-1)
        if last >= 0:
            out[b][last] = sum(rrow)
    return _tensor(out, token_rewards)


# ---------------------------------------------------------------------------- estimators
def depth_pool(scores: list[list[float]], rows: list[int], k: int) -> list[float]:
    """Returns of turn k (0-based) of the given rows that reached it, in row order."""
    return [scores[row][k] for row in rows if len(scores[row]) > k]


def turn_scores(rewards: Rows, mask: Rows, turn: bool, gamma: float) -> list[list[float]]:
    """Per row, one score per turn: its return (turn credit) or the row's reward sum."""
    return [turn_returns(r, m, gamma) if turn else [sum(r)] * max(turn_of(m), default=0)
            for r, m in zip(rewards, mask)]


def against_group(x: EstimatorInput, others_only: bool, score: Callable[[float, list[float]], float]) -> Rows:
    """Each generated id's `score(g, pool)`: g its row's score (per turn under turn credit), pool
    the same scores of the group's rows (or, `others_only`, its other rows).

    Under turn credit, pool is turn k's returns of the rows that reached turn k; a turn no other
    episode of a group of more than one reached gets 0 without a score. Otherwise pool holds the
    rows' reward sums."""
    rewards, mask, ids = _rows(x.token_rewards), _rows(x.response_mask), x.index.tolist()
    turn = x.config.credit == "turn"
    scores = turn_scores(rewards, mask, turn, x.config.gamma)
    per_turn: Rows = [[] for _ in rewards]
    for rows in groups(ids).values():
        for row in rows:
            others = [other for other in rows if other != row]
            peers = others if others_only else rows
            for k, g in enumerate(scores[row]):
                pool = depth_pool(scores, peers, k) if turn else [sum(rewards[o]) for o in peers]
                lone = turn and len(others) > 0 and not depth_pool(scores, others, k)
                per_turn[row].append(0.0 if lone else score(g, pool))
    return _spread(per_turn, mask)


def grpo(x: EstimatorInput) -> Estimate:
    """GRPO: (score - group mean) / (group std + eps); a group of one keeps its raw score.

    Turn credit: turn k against turn k of the group's episodes; a turn no other episode reached
    gets 0 (its raw return in a group of one)."""
    def score(g: float, pool: list[float]) -> float:
        mean, std = mean_std(pool) if len(pool) > 1 else (0.0, 1.0)
        return (g - mean) / (std + EPS) if x.config.norm_adv_by_std_in_grpo else g - mean
    out = _tensor(against_group(x, False, score), x.token_rewards)
    return out, out


def rloo(x: EstimatorInput) -> Estimate:
    """RLOO: score minus the mean score of the group's other episodes (baseline 0 if none).

    Turn credit: turn k against turn k of the group's other episodes (0 if none reached it, in a
    group of more than one)."""
    out = _tensor(against_group(x, True, lambda g, pool: g - (sum(pool) / len(pool) if pool else 0.0)),
                  x.token_rewards)
    return out, out


def token_returns(reward_row: list[float], mask_row: list[float], gamma: float) -> list[float]:
    """Discounted return at each generated id over generated ids only (masked ids skipped)."""
    out, running = [0.0] * len(mask_row), 0.0
    for t in range(len(mask_row) - 1, -1, -1):
        if mask_row[t] > 0:
            running = reward_row[t] + gamma * running
            out[t] = running
    return out


def reinforce_plus_plus(x: EstimatorInput) -> Estimate:
    """REINFORCE++: discounted returns whitened over the batch; returns are the unwhitened ones."""
    rewards, mask = _rows(x.token_rewards), _rows(x.response_mask)
    if x.config.credit == "turn":
        returns = _spread([turn_returns(r, m, x.config.gamma) for r, m in zip(rewards, mask)], mask)
    else:
        returns = [token_returns(r, m, x.config.gamma) for r, m in zip(rewards, mask)]
    return _tensor(whiten(returns, mask), x.token_rewards), _tensor(returns, x.token_rewards)


def reinforce_plus_plus_baseline(x: EstimatorInput) -> Estimate:
    """REINFORCE++-baseline: score minus its group mean (0 for a group of one), then whitened.

    Turn credit: turn k minus the mean of turn k over the group; a turn no other episode reached
    gets 0 (its raw return in a group of one)."""
    centered = against_group(x, False, lambda g, pool: g - (sum(pool) / len(pool) if len(pool) > 1 else 0.0))
    out = _tensor(whiten(centered, _rows(x.response_mask)), x.token_rewards)
    return out, out


def gae(x: EstimatorInput) -> Estimate:
    """GAE over generated ids (token) or over turns (turn); advantages whitened, returns A + V."""
    if x.values is None:
        raise ValueError("gae needs critic values")
    rewards, mask, vals = _rows(x.token_rewards), _rows(x.response_mask), _rows(x.values)
    gamma, lam = x.config.gamma, x.config.lam
    adv, returns = _zeros(len(mask), len(mask[0]) if mask else 0), _zeros(len(mask), len(mask[0]) if mask else 0)
    for b, (rrow, mrow, vrow) in enumerate(zip(rewards, mask, vals)):
        if x.config.credit == "turn":
            starts = turn_starts(mrow)
            r_turn = turn_rewards(rrow, mrow)
            v_turn = [vrow[t] for t in starts]
            a_turn = [0.0] * len(starts)
            next_value, next_adv = 0.0, 0.0
            for k in range(len(starts) - 1, -1, -1):
                delta = r_turn[k] + gamma * next_value - v_turn[k]
                a_turn[k] = next_adv = delta + gamma * lam * next_adv
                next_value = v_turn[k]
            for t, k in enumerate(turn_of(mrow)):
                if mrow[t] > 0:
                    adv[b][t], returns[b][t] = a_turn[k - 1], a_turn[k - 1] + v_turn[k - 1]
        else:
            next_value, next_adv = 0.0, 0.0
            for t in range(len(mrow) - 1, -1, -1):
                if mrow[t] > 0:  # masked ids are transparent: no TD error, no bootstrap value
                    delta = rrow[t] + gamma * next_value - vrow[t]
                    adv[b][t] = next_adv = delta + gamma * lam * next_adv
                    returns[b][t] = adv[b][t] + vrow[t]
                    next_value = vrow[t]
    return _tensor(whiten(adv, mask), x.token_rewards), _tensor(returns, x.token_rewards)


REFERENCE: dict[str, Estimator] = {
    "grpo": grpo,
    "rloo": rloo,
    "reinforce_plus_plus": reinforce_plus_plus,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
    "gae": gae,
}


def reference_advantages(name: str, inputs: EstimatorInput) -> Estimate:
    """Reference twin of `compute_advantages` (credit=outcome first moves rewards to the end)."""
    if inputs.config.credit == "outcome":
        inputs = inputs.replace(token_rewards=outcome_rewards(inputs.token_rewards, inputs.response_mask))
    return REFERENCE[name](inputs)


# ---------------------------------------------------------------------------- episode-level (verl's names)
def episode_score(reward_row: list[float], mask_row: list[float], turn: bool, gamma: float) -> float:
    """Reward sum, or under turn credit the first turn's return G_1 (0 without a turn)."""
    if not turn:
        return sum(reward_row)
    returns = turn_returns(reward_row, mask_row, gamma)
    return returns[0] if returns else 0.0


def _episode_out(per_row: list[float], mask: Rows, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every generated id of row b gets per_row[b]."""
    out = _tensor([[per_row[b] if m > 0 else 0.0 for m in mrow] for b, mrow in enumerate(mask)], like)
    return out, out


def opo(x: EstimatorInput) -> Estimate:
    """OPO: score minus sum_j len_j s_j / sum_j len_j over the group (0 for a group of one)."""
    rewards, mask, ids = _rows(x.token_rewards), _rows(x.response_mask), x.index.tolist()
    scores = [episode_score(r, m, x.config.credit == "turn", x.config.gamma) for r, m in zip(rewards, mask)]
    lengths = [sum(m) for m in mask]
    adv = [0.0] * len(scores)
    for rows in groups(ids).values():
        total = sum(lengths[o] for o in rows)
        base = sum(lengths[o] * scores[o] for o in rows) / total if len(rows) > 1 and total > 0 else 0.0
        for row in rows:
            adv[row] = scores[row] - base
    return _episode_out(adv, mask, x.token_rewards)


def grpo_passk(x: EstimatorInput) -> Estimate:
    """Pass@k: the first best row of each group gets (max - second max) [/ (std + eps)]."""
    rewards, mask, ids = _rows(x.token_rewards), _rows(x.response_mask), x.index.tolist()
    scores = [episode_score(r, m, x.config.credit == "turn", x.config.gamma) for r, m in zip(rewards, mask)]
    adv = [0.0] * len(scores)
    for rows in groups(ids).values():
        if len(rows) < 2:
            raise ValueError("grpo_passk needs at least 2 episodes per group")
        pool = [scores[o] for o in rows]
        best = rows[pool.index(max(pool))]
        ordered = sorted(pool, reverse=True)
        gap = ordered[0] - ordered[1]
        adv[best] = gap / (mean_std(pool)[1] + EPS) if x.config.norm_adv_by_std_in_grpo else gap
    return _episode_out(adv, mask, x.token_rewards)


def gpg(x: EstimatorInput) -> Estimate:
    """GPG: (B / #non-zero scores) * (score - group mean); a group of one has mean 0."""
    rewards, mask, ids = _rows(x.token_rewards), _rows(x.response_mask), x.index.tolist()
    scores = [episode_score(r, m, x.config.credit == "turn", x.config.gamma) for r, m in zip(rewards, mask)]
    alpha = len(scores) / max(sum(1 for s in scores if s != 0), 1)
    adv = [0.0] * len(scores)
    for rows in groups(ids).values():
        mean = sum(scores[o] for o in rows) / len(rows) if len(rows) > 1 else 0.0
        for row in rows:
            adv[row] = alpha * (scores[row] - mean)
    return _episode_out(adv, mask, x.token_rewards)


def remax(x: EstimatorInput) -> Estimate:
    """ReMax: reward-to-go (turn credit: G_k) minus the mean score of the group's other episodes."""
    rewards, mask, ids = _rows(x.token_rewards), _rows(x.response_mask), x.index.tolist()
    turn = x.config.credit == "turn"
    scores = [episode_score(r, m, turn, x.config.gamma) for r, m in zip(rewards, mask)]
    adv, returns = _zeros(len(mask), len(mask[0]) if mask else 0), _zeros(len(mask), len(mask[0]) if mask else 0)
    for rows in groups(ids).values():
        for row in rows:
            others = [scores[o] for o in rows if o != row]
            base = sum(others) / len(others) if others else 0.0
            if turn:
                per_turn = turn_returns(rewards[row], mask[row], x.config.gamma)
                to_go = [per_turn[k - 1] if mask[row][t] > 0 else 0.0 for t, k in enumerate(turn_of(mask[row]))]
            else:  # undiscounted sum of the generated ids' rewards from t on
                to_go = [sum(r * m for r, m in zip(rewards[row][t:], mask[row][t:])) if mask[row][t] > 0 else 0.0
                         for t in range(len(mask[row]))]
            for t, m in enumerate(mask[row]):
                if m > 0:
                    returns[row][t], adv[row][t] = to_go[t], to_go[t] - base
    return _tensor(adv, x.token_rewards), _tensor(returns, x.token_rewards)


REFERENCE.update({"opo": opo, "grpo_passk": grpo_passk, "gpg": gpg, "remax": remax})
