"""Does an advantage estimator teach the policy to wait? Turn credit, settled by experiment.

The `wait_walk` env (agentrl/envs/wait_walk.py) lets the policy stretch an episode with `Wait`
moves that earn nothing and cost nothing (no discount, no step cost, `max_steps` 6; only a wait
on the last step loses the episode, and the observation says which step that is). The right
policy gradient is indifferent to waiting. The tiny embedded model, warm-started on uniform
moves (a third of them waits), is trained with each estimator over seeds, and the table gives
how often the trained policy waits (the share of wait moves in its last training batches,
sampled at temperature 1) and its greedy eval success.

## What each baseline conditions on
Write s_k for the score d log pi(a_k | h_k) of an episode's turn k, G_k for its return from turn
k on, and R for its whole return. Every estimator's update is a sum over an episode's turns of
s_k times an advantage; E[s_k | h_k] = 0, so a baseline term b s_k adds nothing in expectation as
long as b does not depend on this episode's actions from turn k on.
- outcome / token (GRPO): every turn gets (R - mean_group R) / std_group R. With a 0/1 reward
  the advantage depends on the episode only through R, so E[update] = c * grad P(success): no
  bias of any kind in the direction, waiting included, whatever the loss normalisation (in this
  env R is independent of how long the episode lasted).
- turn (GRPO, RLOO, REINFORCE++-baseline over turn-k groups): turn k is compared with turn k of
  the group's episodes that reached it. Which *other* episodes reached turn k depends on their
  actions, never on this one's, so the turn-k baseline adds no bias; and an episode with more
  turns gets more advantage terms because it has more actions: that is the policy gradient's sum
  over time, not a length bias. RLOO's turn-k form has E[update] = grad exactly under a loss that
  sums each episode's tokens (tests/algos/test_wait_gradient.py).
  The bias is elsewhere: a turn no other episode of its group reached had no comparison and kept
  its raw return G_k, an advantage whose mean is not 0 and whose presence depends on the other
  episodes' lengths. The default loss divides by the mini-batch's token count (token-mean),
  which an episode's own waits raise; that weight times a non-centred advantage gives
  E[update_wait] < 0: turn credit taught the policy *not* to wait (exactly: -1.2% of the push
  towards the goal for GRPO, -2.0% for Dr. GRPO, -1.5% for RLOO at a policy waiting 42% of the
  time). The fix: a lone turn gets advantage 0 (a group of one sequence keeps its raw returns,
  as verl's group of one). Then E[update_wait] = 0 under every loss normalisation, and turn k is
  weighted by the chance that another episode reached it (the gradient shortened, not turned).
- GiGPO: a turn is compared with the turns of its group that started from the same env state. A
  wait leaves the state as it was, so an episode's own earlier and later turns sit in its anchor
  group; the mean of such a group adds no bias here, its std does (it depends on the episode's
  own returns, counted once per wait): E[update_wait] > 0, GiGPO teaches waiting (+1.7% at that
  policy). `norm_adv_by_std_in_grpo=false`, or states that differ turn by turn, remove it.
- GAE (PPO with a critic, gamma = lam = 1 over turns): the baseline is V(h_k), a function of the
  history only, so the expected update is unbiased up to the critic's error; the critic sees the
  turn count in the history and can be wrong about it, which is what training measures here.

`--exact` only prints each estimator's exact expected update on the tabular game (no training).

    python benchmarks/turn_credit.py                      # 5 estimators x seeds 0-2, 20 steps each
    python benchmarks/turn_credit.py --estimators turn,outcome --seeds 0,1,2,3
    python benchmarks/turn_credit.py --quick              # 2 small steps of seed 0: a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from agentrl.algos.wait_gradient import wait_bias
from agentrl.api import fit
from agentrl.config import AlgorithmConfig
from agentrl.metrics import read_jsonl

ESTIMATORS: dict[str, dict[str, object]] = {
    "turn": {"algorithm.adv_estimator": "grpo", "algorithm.credit": "turn"},
    "outcome": {"algorithm.adv_estimator": "grpo", "algorithm.credit": "outcome"},
    "token": {"algorithm.adv_estimator": "grpo", "algorithm.credit": "token"},
    "gigpo": {"algorithm.adv_estimator": "gigpo", "algorithm.credit": "turn"},
    "gae": {"algorithm.adv_estimator": "gae", "algorithm.credit": "turn", "algorithm.lam": 1.0,
            "critic.enable": True, "critic.lr": 1e-3},
}
WAIT_SHARE = "env/wait_walk/wait_share"
# --quick: a smaller tiny model warm-started for a few steps, two groups of 4, a short eval (a
# smoke run: the steps, the wait share and the evals are those of a full run, their sizes not).
QUICK: dict[str, object] = {
    "model.tiny.hidden_size": 32, "model.tiny.num_hidden_layers": 1, "model.tiny.intermediate_size": 64,
    "model.tiny.vocab_size": 300, "model.warm_start.max_steps": 2, "model.warm_start.batch_size": 4,
    "rollout.batch_size": 8, "actor.ppo_mini_batch_size": 8, "actor.micro_batch_size": 8,
    "critic.ppo_mini_batch_size": 8, "critic.micro_batch_size": 8, "trainer.eval_episodes": 4}


def config(estimator: str, seed: int, steps: int, run_dir: Path) -> dict[str, object]:
    """The run's config: wait_walk, the tiny model, `estimator`'s algorithm, no discount. Eight
    groups of 4 and lr 3e-4: with 4 groups of 8 at lr 1e-3 (FrozenLake's) the policy settled on
    one direction for every task within 2 steps, every group then all won or all lost, and no
    advantage was left to learn from (measured: loss 0 from step 3 on)."""
    return {"exp_name": f"turn_credit_{estimator}_{seed}", "seed": seed, "run_dir": str(run_dir),
            "env": {"type": "wait_walk", "max_turns": 6, "args": {"max_steps": 6}},
            "rollout.batch_size": 32, "rollout.group_size": 4, "rollout.max_new_tokens": 8,
            "algorithm.gamma": 1.0, "actor.lr": 3e-4, "actor.ppo_mini_batch_size": 16,
            "trainer.total_steps": steps, "trainer.test_freq": 0, "trainer.save_freq": 0,
            "trainer.eval_episodes": 32, **ESTIMATORS[estimator]}


def train(estimator: str, seed: int, steps: int, folder: Path, quick: bool = False) -> dict[str, float]:
    """Train one run; the wait share of its first and last batches, and its eval before and after."""
    run_dir = folder / f"{estimator}_{seed}"
    cfg = {**config(estimator, seed, steps, run_dir), **(QUICK if quick else {})}
    overrides = {k: v for k, v in cfg.items() if "." in k}
    start = time.perf_counter()
    summary = fit({k: v for k, v in cfg.items() if "." not in k}, overrides=overrides, log=lambda _: None)
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if WAIT_SHARE in r]
    last = rows[-min(5, len(rows)):]
    evals = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "eval/turns" in r]
    return {"wait_share_first": round(rows[0][WAIT_SHARE], 3),
            "wait_share_last": round(statistics.fmean(r[WAIT_SHARE] for r in last), 3),
            "eval_success_before": summary["eval_success_before"], "eval_success_after": summary["eval_success_after"],
            "eval_turns_after": round(evals[-1]["eval/turns"], 2), "seconds": round(time.perf_counter() - start, 1)}


def exact_biases() -> dict[str, float]:
    """Each estimator's exact wait bias (wait_gradient.py) at a policy that waits 42% of the time,
    under the default loss normalisation (token-mean)."""
    logits = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    cases = {"turn": ("grpo", "turn"), "outcome": ("grpo", "outcome"), "token": ("grpo", "token"),
             "gigpo": ("gigpo", "turn"), "turn_rloo": ("rloo", "turn")}
    return {name: round(wait_bias(AlgorithmConfig(adv_estimator=e, credit=c), logits, loss_agg_mode="token-mean"), 5)
            for name, (e, c) in cases.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--estimators", default=",".join(ESTIMATORS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--exact", action="store_true", help="only the exact expected updates (no training)")
    p.add_argument("--quick", action="store_true",
                   help="2 small steps of seed 0 per estimator, a smaller tiny model (smoke run)")
    args = p.parse_args()
    if args.quick:
        args.steps, args.seeds = 2, "0"
    names = args.estimators.split(",")
    unknown = [n for n in names if n not in ESTIMATORS]
    if unknown:
        p.error(f"--estimators: unknown {unknown[0]!r}; use some of {', '.join(ESTIMATORS)}")
    out: dict[str, object] = {"exact_wait_bias": exact_biases()}
    if not args.exact:
        runs: dict[str, dict[str, dict[str, float]]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for name in names:
                for seed in args.seeds.split(","):
                    result = train(name, int(seed), args.steps, Path(tmp), args.quick)
                    runs.setdefault(name, {})[seed] = result
                    print(name, seed, json.dumps(result), file=sys.stderr, flush=True)
        out.update(runs=runs, steps=args.steps, quick=args.quick)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
