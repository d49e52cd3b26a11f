"""The training loop: each step is a short list of named stages, in the order data moves.

    collect -> pack -> score -> reward -> advantages -> update -> sync -> log -> (evaluate) -> (checkpoint)

`collect` applies the group filters (DAPO dynamic sampling, RAGEN variance filter); `score`
recomputes the trainer's logprobs (the proximal policy) and, when used, the reference's and
the critic's; `reward` applies a KL penalty to the token rewards when configured.

The trainer knows nothing of envs or agents: it gets a collector that turns tasks into
trajectories, an engine to push weights to, and the actor it updates.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

from agentrl.algos.advantages import compute_advantages
from agentrl.algos.kl_control import KLController
from agentrl.algos.losses import kl_penalty, masked_mean
from agentrl.config import Config
from agentrl.metrics import MetricsLogger, Timer, plot_curves, write_summary
from agentrl.rollout.collector import CollectResult, RolloutCollector, make_tasks
from agentrl.rollout.trajectory import Trajectory
from agentrl.train.actor import Actor
from agentrl.train.batch import Batch, pack
from agentrl.train.checkpoint import (latest_checkpoint, load_optimizer, load_state, rng_state,
                                      save_checkpoint, set_rng_state)

EVAL_SEED_BASE = 1_000_000  # eval env seeds live above every training seed
GEN_BATCH_STRIDE = 1_000_003  # extra generation batches of a step draw seeds far from other steps
EVAL_STEP = 2**31 - 1  # a fixed pseudo-step: every evaluation plays the same held-out tasks


class Trainer:
    """Runs `Config.trainer.total_steps` steps of collect / update / sync."""

    def __init__(self, cfg: Config, actor: Actor, engine: Any, collector: RolloutCollector,
                 tokenizer: Any, run_dir: Path,
                 eval_baselines: Callable[[list[Trajectory]], dict[str, float]] | None = None,
                 reference: Any = None, critic: Any = None) -> None:
        self.cfg = cfg
        self.actor = actor
        self.engine = engine
        self.collector = collector
        self.tokenizer = tokenizer
        self.run_dir = Path(run_dir)
        self.eval_baselines = eval_baselines
        self.reference = reference
        self.critic = critic
        self.kl_ctrl = KLController(cfg.algorithm.kl_ctrl)
        self.timer = Timer()
        self.step_idx = 0
        self.summary: dict[str, Any] = {}
        self.logger: MetricsLogger | None = None

    # ------------------------------------------------------------------ the loop
    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train to `total_steps`, evaluating before and after; returns the summary."""
        t0 = time.perf_counter()
        if resume:
            self._restore()
        self.logger = MetricsLogger(self.run_dir, loggers=self.cfg.trainer.logger,
                                    total_steps=self.cfg.trainer.total_steps,
                                    show_progress=self.cfg.trainer.progress,
                                    resume_from_step=self.step_idx if resume else None)
        try:
            if self.step_idx == 0:
                before = self.evaluate()
                self.summary["eval_success_before"] = before["eval/success"]
                self.logger.log(0, before)
            while self.step_idx < self.cfg.trainer.total_steps:
                self.step()
            after = self.evaluate()
            self.logger.log(self.step_idx, after)
            self._checkpoint()
        finally:
            self.logger.close()
        self.summary.update(
            eval_success_after=after["eval/success"],
            eval_optimum=after.get("eval/optimal_success", float("nan")),
            **{k.replace("eval/", "eval_"): v for k, v in after.items() if k.startswith("eval/baseline_")},
            steps=self.step_idx,
            wall_seconds=round(time.perf_counter() - t0, 2),
        )
        write_summary(self.run_dir, self.summary)
        plot_curves(self.logger.history(), self.run_dir / "curves.png")
        return self.summary

    def step(self) -> dict[str, float]:
        """One training step; returns its metrics."""
        self.step_idx += 1
        metrics: dict[str, float] = {}
        with self.timer.scope("collect"):
            result, filter_stats = self.collect()
        metrics.update(filter_stats)
        if result.trajectories:
            with self.timer.scope("pack"):
                batch = pack(result.trajectories, self.tokenizer.pad_token_id)
            with self.timer.scope("score"):
                self.score(batch)
            with self.timer.scope("reward"):
                metrics.update(self.reward(batch))
            with self.timer.scope("advantages"):
                batch.advantages, batch.returns = self.advantages(batch)
            with self.timer.scope("update"):
                if self.critic is not None:
                    metrics.update(self.critic.update(batch))
                metrics["policy/lr"] = self.actor.schedule(self.step_idx - 1, self.cfg.trainer.total_steps)
                metrics.update(self.actor.update(batch))
            with self.timer.scope("sync"):
                self.sync()
            metrics.update(rollout_metrics(result, batch))
        metrics.update(self.engine.stats.pop())
        if self._due(self.cfg.trainer.test_freq):
            with self.timer.scope("evaluate"):
                metrics.update(self.evaluate())
        if self._due(self.cfg.trainer.save_freq):
            with self.timer.scope("checkpoint"):
                self._checkpoint()
        metrics.update(self.timer.pop())
        self.logger.log(self.step_idx, metrics)
        return metrics

    # ------------------------------------------------------------------ stages
    def collect(self) -> tuple[CollectResult, dict[str, float]]:
        """Play this step's groups with the current policy, then filter groups as configured.

        With DAPO's `filter_groups` and `max_num_gen_batches` > 1, further batches (fresh env
        seeds) are collected until the step has `batch_size / group_size` informative groups.
        """
        r, fg = self.cfg.rollout, self.cfg.algorithm.filter_groups
        n_groups = r.batch_size // r.group_size
        kept: list[list[Trajectory]] = []
        errors: list[str] = []
        dropped_failed = dropped_equal = 0
        batches = max(1, fg.max_num_gen_batches) if fg.enable else 1
        for attempt in range(batches):
            tasks = make_tasks(self.cfg.seed, self.step_idx + attempt * GEN_BATCH_STRIDE, n_groups, r.group_size)
            # Group ids must stay distinct across generation batches: baselines are per group.
            tasks = [replace(t, group_id=t.group_id + attempt * n_groups) for t in tasks]
            result = self.collector.collect(tasks)
            errors += result.errors
            dropped_failed += result.dropped_groups
            for group in _groups(result.trajectories):
                if fg.enable and len({_group_metric(t, fg.metric) for t in group}) == 1:
                    dropped_equal += 1
                else:
                    kept.append(group)
            if len(kept) >= n_groups:
                break
        if not kept and not fg.enable:
            raise RuntimeError(f"step {self.step_idx}: every episode failed; first error: "
                               f"{errors[0] if errors else 'unknown'}")
        kept = kept[:n_groups]
        n_before_std = len(kept)
        if r.rollout_filter_ratio < 1.0 and kept:
            k = max(1, math.ceil(r.rollout_filter_ratio * len(kept)))
            stds = [float(torch.tensor([t.total_reward for t in g]).std()) if len(g) > 1 else 0.0 for g in kept]
            order = sorted(range(len(kept)), key=lambda i: -stds[i])[:k]
            kept = [kept[i] for i in sorted(order)]
        stats = {"rollout/gen_batches": float(attempt + 1),
                 "rollout/filtered_groups_equal": float(dropped_equal),
                 "rollout/filtered_groups_std": float(n_before_std - len(kept)),
                 "rollout/kept_groups": float(len(kept))}
        trajs = [t for g in kept for t in g]
        return CollectResult(trajs, errors, dropped_failed), stats

    def score(self, batch: Batch) -> None:
        """Recompute logprobs under the current (proximal) policy, the reference and the critic."""
        batch.old_logprobs = self.actor.compute_logprobs(batch)
        if self.reference is not None:
            batch.ref_logprobs = self.reference.compute_logprobs(batch)
        if self.critic is not None:
            batch.values = self.critic.compute_values(batch)

    def reward(self, batch: Batch) -> dict[str, float]:
        """Subtract the KL penalty from the token rewards (verl's apply_kl_penalty), if on."""
        alg = self.cfg.algorithm
        if not alg.use_kl_in_reward:
            return {}
        kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, alg.kl_penalty) * batch.loss_mask
        batch.token_rewards = batch.token_rewards - self.kl_ctrl.value * kl
        seq_kl = (kl.sum(-1) / batch.loss_mask.sum(-1).clamp(min=1.0)).mean()
        coef = self.kl_ctrl.value
        self.kl_ctrl.update(float(seq_kl), n_steps=batch.size)
        return {"reward/kl_penalty": float(seq_kl), "reward/kl_coef": coef}

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantages and returns from the configured estimator."""
        return compute_advantages(self.cfg.algorithm.adv_estimator, batch.token_rewards, batch.loss_mask,
                                  batch.group_index, batch.values, self.cfg.algorithm, batch.state_ids)

    def sync(self) -> None:
        """Push the updated weights to the engine, so the next rollouts use them."""
        self.engine.load_weights({k: v.detach() for k, v in self.actor.model.state_dict().items()})

    def evaluate(self) -> dict[str, float]:
        """Greedy episodes on held-out env seeds."""
        n = self.cfg.trainer.eval_episodes
        tasks = make_tasks(self.cfg.seed, EVAL_STEP, n, 1, greedy=True, seed_base=EVAL_SEED_BASE)
        result = self.collector.collect(tasks)
        trajs = result.trajectories
        out = {
            "eval/success": _mean([float(t.info.get("success", False)) for t in trajs]),
            "eval/return": _mean([t.total_reward for t in trajs]),
            "eval/turns": _mean([t.num_turns for t in trajs]),
            "eval/errors": float(len(result.errors)),
        }
        optimal = [t.info["optimal_success"] for t in trajs if "optimal_success" in t.info]
        if optimal:
            out["eval/optimal_success"] = _mean(optimal)
        if self.eval_baselines is not None:
            out.update({f"eval/baseline_{k}": v for k, v in self.eval_baselines(trajs).items()})
        self._write_samples(trajs[:2])
        return out

    def _write_samples(self, trajs: list[Trajectory]) -> None:
        """Append a few decoded eval episodes to samples.jsonl, for people to read."""
        import json

        with open(self.run_dir / "samples.jsonl", "a") as f:
            for t in trajs:
                text = self.tokenizer.decode(t.token_ids, skip_special_tokens=False)
                f.write(json.dumps({"step": self.step_idx, "reward": t.total_reward,
                                    "success": bool(t.info.get("success")), "text": text}) + "\n")

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint(self) -> None:
        state = {"engine": self.engine.state_dict(), "rng": rng_state(), "summary": dict(self.summary),
                 "kl_coef": self.kl_ctrl.value,
                 "critic": self.critic.state_dict() if self.critic is not None else None}
        save_checkpoint(self.run_dir / "checkpoints", self.step_idx, self.actor.model, self.tokenizer,
                        self.actor.optimizer, state, keep=self.cfg.trainer.max_checkpoints)

    def _restore(self) -> None:
        ckpt = latest_checkpoint(self.run_dir / "checkpoints")
        if ckpt is None:
            return
        from safetensors.torch import load_file

        weights = load_file(str(ckpt / "model.safetensors"))
        self.actor.model.load_state_dict(weights, strict=False)
        load_optimizer(ckpt, self.actor.optimizer)
        state = load_state(ckpt)
        self.step_idx = int(state["step"])
        self.summary = dict(state.get("summary", {}))
        self.kl_ctrl.value = float(state.get("kl_coef", self.kl_ctrl.value))
        if self.critic is not None and state.get("critic") is not None:
            self.critic.load_state_dict(state["critic"])
        set_rng_state(state["rng"])
        self.sync()
        # Checkpoints written before the engine had a state API kept these two keys.
        self.engine.load_state_dict(state.get("engine") or {"policy_version": state["policy_version"],
                                                            "seed_rng": state["engine_rng"]})

    def _due(self, freq: int) -> bool:
        return freq > 0 and self.step_idx % freq == 0 and self.step_idx < self.cfg.trainer.total_steps


def rollout_metrics(result: CollectResult, batch: Batch) -> dict[str, float]:
    """rollout/* and reward/* metrics of one step's trajectories."""
    trajs = result.trajectories
    rewards = torch.tensor([t.total_reward for t in trajs])
    mask = batch.loss_mask
    diff = (batch.behaviour_logprobs - batch.old_logprobs).abs() * mask
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(trajs) > 1 else 0.0,
        "reward/max": float(rewards.max()),
        "reward/min": float(rewards.min()),
        "rollout/success": _mean([float(t.info.get("success", False)) for t in trajs]),
        "rollout/turns": _mean([t.num_turns for t in trajs]),
        "rollout/invalid_actions": _mean([t.info.get("invalid_actions", 0) for t in trajs]),
        "rollout/truncated_replies": _mean([t.info.get("truncated_replies", 0) for t in trajs]),
        "rollout/response_tokens": _mean([t.num_generated for t in trajs]),
        "rollout/sequence_tokens": _mean([len(t.token_ids) for t in trajs]),
        "rollout/episodes": float(len(trajs)),
        "rollout/errors": float(len(result.errors)),
        "rollout/dropped_groups": float(result.dropped_groups),
        "policy/logprob_diff_mean": float(masked_mean(diff, mask)),
        "policy/logprob_diff_max": float(diff.max()),
    }


def _groups(trajs: list[Trajectory]) -> list[list[Trajectory]]:
    """Trajectories grouped by group id, in order of first appearance."""
    groups: dict[int, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
    return list(groups.values())


def _group_metric(t: Trajectory, metric: str) -> float:
    return float(bool(t.info.get("success"))) if metric == "success" else round(t.total_reward, 6)


def _mean(xs: list[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0
