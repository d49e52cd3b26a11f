"""Plain-loop reference policy losses and aggregation, used only by tests.

Each function mirrors the one of the same name in `agentrl.algos.losses` /
`agentrl.algos.policy_losses` (read their docstrings: the spec), written as explicit loops over
rows and tokens in Python floats. Each loss returns (loss, grad): the loss value and its
analytic gradient with respect to each token's logprob, (B, T) nested lists, so that the
vectorised autograd can be checked too. Nothing in training imports this module.
"""

from __future__ import annotations

import math

Rows = list[list[float]]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _clamp(x: float, low: float, high: float) -> float:
    return min(max(x, low), high)


def _on(mask: Rows) -> list[list[int]]:
    """Indices of the generated ids of each row."""
    return [[t for t, m in enumerate(row) if m > 0] for row in mask]


def aggregate(loss: Rows, mask: Rows, mode: str, horizon: float) -> float:
    """The five aggregation modes, over rows with generated ids."""
    on = _on(mask)
    rows = [b for b in range(len(mask)) if on[b]]
    sums = {b: sum(loss[b][t] for t in on[b]) for b in rows}
    n = max(len(rows), 1)
    if mode == "token-mean":
        return sum(sums.values()) / max(sum(len(on[b]) for b in rows), 1)
    if mode == "seq-mean-token-sum":
        return sum(sums.values()) / n
    if mode == "seq-mean-token-mean":
        return sum(sums[b] / len(on[b]) for b in rows) / n
    if mode == "seq-mean-token-sum-norm":
        return sum(sums.values()) / horizon
    if mode == "dr-grpo":
        return sum(sums.values()) / (n * horizon)
    raise ValueError(mode)


def token_weights(mask: Rows, mode: str, horizon: float) -> Rows:
    """d aggregate / d loss[b][t]: how much each token's loss counts in the aggregate."""
    on = _on(mask)
    rows = [b for b in range(len(mask)) if on[b]]
    n, tokens = max(len(rows), 1), max(sum(len(on[b]) for b in rows), 1)
    out = [[0.0] * len(row) for row in mask]
    for b in rows:
        for t in on[b]:
            out[b][t] = {"token-mean": 1.0 / tokens, "seq-mean-token-sum": 1.0 / n,
                         "seq-mean-token-mean": 1.0 / (n * len(on[b])),
                         "seq-mean-token-sum-norm": 1.0 / horizon,
                         "dr-grpo": 1.0 / (n * horizon)}[mode]
    return out


def cispo(logp: Rows, old: Rows, adv: Rows, mask: Rows, low: float, high: float, mode: str,
          horizon: float) -> tuple[float, Rows]:
    """-clip(ratio, 1 - low, 1 + high) * A * logp per token (weight constant), then `mode`."""
    loss, dloss = [], []
    for lrow, orow, arow in zip(logp, old, adv):
        w = [_clamp(math.exp(_clamp(lp - o, -20, 20)), 1 - low, 1 + high) for lp, o in zip(lrow, orow)]
        loss.append([-wi * a * lp for wi, a, lp in zip(w, arow, lrow)])
        dloss.append([-wi * a for wi, a in zip(w, arow)])
    return _chain(loss, dloss, mask, mode, horizon)


def gpg(logp: Rows, old: Rows, adv: Rows, mask: Rows, mode: str, horizon: float) -> tuple[float, Rows]:
    """-A * logp per token, then `mode`."""
    loss = [[-a * lp for a, lp in zip(arow, lrow)] for lrow, arow in zip(logp, adv)]
    dloss = [[-a for a in arow] for arow in adv]
    return _chain(loss, dloss, mask, mode, horizon)


def sapo(logp: Rows, old: Rows, adv: Rows, mask: Rows, tau_pos: float, tau_neg: float) -> tuple[float, Rows]:
    """-(4 / tau) sigmoid(tau (r - 1)) * A per token, tau by the sign of A; seq-mean-token-mean."""
    loss, dloss = [], []
    for lrow, orow, arow in zip(logp, old, adv):
        lrow_loss, lrow_grad = [], []
        for lp, o, a in zip(lrow, orow, arow):
            r = math.exp(_clamp(lp - o, -20, 20))
            tau = tau_pos if a > 0 else tau_neg
            s = _sigmoid(tau * (r - 1))
            lrow_loss.append(-(4 / tau) * s * a)
            lrow_grad.append(-4 * s * (1 - s) * r * a)  # d/dlogp: dr/dlogp = r
        loss.append(lrow_loss)
        dloss.append(lrow_grad)
    return _chain(loss, dloss, mask, "seq-mean-token-mean", 1.0)


def gspo(logp: Rows, old: Rows, adv: Rows, mask: Rows, low: float, high: float) -> tuple[float, Rows]:
    """Sequence ratio s = exp(mean log ratio); per token max(-A s, -A clip(s)); seq-mean-token-mean."""
    on = _on(mask)
    loss, dloss = [], []
    for b, (lrow, orow, arow) in enumerate(zip(logp, old, adv)):
        n = max(len(on[b]), 1)
        s = math.exp(min(sum(lrow[t] - orow[t] for t in on[b]) / n, 10.0))
        row_loss, row_grad = [], []
        for a in arow:
            unclipped, clipped = -a * s, -a * _clamp(s, 1 - low, 1 + high)
            row_loss.append(max(unclipped, clipped))
            # the token's own logprob enters s_it = sg(s) * p_t / sg(p_t): d/dlogp = -A s, unless clipped
            row_grad.append(-a * s if unclipped >= clipped else 0.0)
        loss.append(row_loss)
        dloss.append(row_grad)
    return _chain(loss, dloss, mask, "seq-mean-token-mean", 1.0)


def gmpo(logp: Rows, old: Rows, adv: Rows, mask: Rows, low: float, high: float) -> tuple[float, Rows]:
    """Per sequence -mean(A) * exp(mean of the sign-side-clipped log ratios); mean over sequences."""
    on = _on(mask)
    rows = [b for b in range(len(mask)) if on[b]]
    total, grad = 0.0, [[0.0] * len(row) for row in mask]
    for b in rows:
        n = len(on[b])
        used, free = {}, {}
        for t in on[b]:
            lr, a = logp[b][t] - old[b][t], adv[b][t]
            sign = (a > 0) - (a < 0)
            bounded = _clamp(lr, -low, high)
            used[t] = sign * min(sign * lr, sign * bounded)
            free[t] = sign != 0 and sign * lr <= sign * bounded  # the log ratio itself is used
        ratio = math.exp(sum(used.values()) / n)
        mean_adv = sum(adv[b][t] for t in on[b]) / n
        total += -mean_adv * ratio
        for t in on[b]:
            grad[b][t] = -mean_adv * ratio / n / len(rows) if free[t] else 0.0
    return total / max(len(rows), 1), grad


def _chain(loss: Rows, dloss: Rows, mask: Rows, mode: str, horizon: float) -> tuple[float, Rows]:
    """Aggregate the token losses and chain their per-token derivatives through the aggregation."""
    weights = token_weights(mask, mode, horizon)
    grad = [[w * d for w, d in zip(wrow, drow)] for wrow, drow in zip(weights, dloss)]
    return aggregate(loss, mask, mode, horizon), grad
