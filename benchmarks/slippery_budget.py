"""How far a tabular policy gets on slippery FrozenLake with the episodes a recipe plays.

The model of `configs/frozen_lake_slippery.yaml` must learn one move per cell from a success
rate that starts near 1%. This script asks the same of the easiest learner there is: a softmax
table of logits per cell (no observation to read, no shared weights), trained by the policy
gradient on Gymnasium's own slippery dynamics with `--steps` x `--batch` episodes, its
advantages normalised over the batch (outcome credit) or over the turns that start from the same
cell (GiGPO's same-state groups), Adam on the logits. It prints the success of each seed's greedy
table within the horizon (exact, by dynamic programming) against the optimum. If a table does not
reach 0.8 of the optimum with a budget, a 0.6M-parameter transformer reading text will not either.

    python benchmarks/slippery_budget.py                        # 200 x 32 episodes, seeds 0-2
    python benchmarks/slippery_budget.py --steps 800 --hole-reward -1 --credit state
    python benchmarks/slippery_budget.py --quick                # 5 steps, seed 0: a smoke run
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import numpy as np

from agentrl.envs.frozen_lake import optimal_success


def train_table(P: dict, steps: int, batch: int, lr: float, horizon: int, hole_reward: float, credit: str,
                seed: int) -> np.ndarray:
    """Logits (16, 4) after `steps` policy-gradient updates of `batch` episodes each."""
    rng = np.random.default_rng(seed)
    theta = np.zeros((16, 4))
    m, v = np.zeros_like(theta), np.zeros_like(theta)
    for _ in range(steps):
        cells, moves, returns = [], [], []
        for _ in range(batch):
            s, visited, ret = 0, [], 0.0
            for _ in range(horizon):
                p = np.exp(theta[s] - theta[s].max())
                a = rng.choice(4, p=p / p.sum())
                outcomes = P[s][a]
                prob, nxt, reward, done = outcomes[rng.choice(len(outcomes), p=[o[0] for o in outcomes])]
                visited.append((s, a))
                s = nxt
                if done:
                    ret = 1.0 if reward > 0 else hole_reward
                    break
            for cell, move in visited:
                cells.append(cell), moves.append(move), returns.append(ret)
        cells, moves, returns = np.array(cells), np.array(moves), np.array(returns)
        adv = np.zeros_like(returns)
        groups = [cells == c for c in np.unique(cells)] if credit == "state" else [np.ones_like(cells, bool)]
        for g in groups:
            adv[g] = (returns[g] - returns[g].mean()) / (returns[g].std() + 1e-6)
        probs = np.exp(theta - theta.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        grad = np.zeros_like(theta)
        np.add.at(grad, cells, -probs[cells] * adv[:, None])
        np.add.at(grad, (cells, moves), adv)
        grad /= len(cells)
        m, v = 0.9 * m + 0.1 * grad, 0.99 * v + 0.01 * grad**2
        theta += lr * m / (np.sqrt(v) + 1e-8)
    return theta


def greedy_success(P: dict, theta: np.ndarray, horizon: int) -> float:
    """Probability that the greedy table reaches the goal within `horizon` moves."""
    policy, value = theta.argmax(1), np.zeros(16)
    for _ in range(horizon):
        value = np.array([sum(p * (1.0 if r > 0 else 0.0 if d else value[n]) for p, n, r, d in P[s][policy[s]])
                          for s in range(16)])
    return float(value[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--horizon", type=int, default=20)
    p.add_argument("--hole-reward", type=float, default=0.0)
    p.add_argument("--credit", choices=["batch", "state"], default="batch")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--quick", action="store_true", help="5 steps of seed 0, for a smoke run")
    args = p.parse_args()
    if args.quick:
        args.steps, args.seeds = 5, "0"
    P = gym.make("FrozenLake-v1", map_name="4x4", is_slippery=True).unwrapped.P
    optimum = optimal_success(P, 16, args.horizon)
    results = [greedy_success(P, train_table(P, args.steps, args.batch, args.lr, args.horizon, args.hole_reward,
                                             args.credit, int(s)), args.horizon) for s in args.seeds.split(",")]
    print(json.dumps({"optimum": round(optimum, 3), "success": [round(r, 3) for r in results],
                      "fraction_of_optimum": [round(r / optimum, 2) for r in results], **vars(args)}))


if __name__ == "__main__":
    main()
