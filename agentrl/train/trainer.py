"""The training loop: each step is a short list of named stages, in the order data moves.

    collect -> pack -> score -> reward -> advantages -> update -> (dump) -> sync -> health
            -> (evaluate) -> log -> (checkpoint)

`collect` asks the rollout source for the step's groups and applies the group filters (DAPO
dynamic sampling, RAGEN variance filter); `score` recomputes the trainer's logprobs (the
proximal policy) and, when used, the reference's and the critic's; `reward` applies a KL
penalty to the token rewards when configured; `dump` writes the trained batch for `agentrl view`
and `health` computes the collapse signals and alarms (train/watch.py).

The trainer knows nothing of envs, agents or engines: it gets a rollout source (rollout/source.py)
that plays a step's groups and an evaluation and takes new weights, and the actor it updates.
It never asks whether the source plays on-policy or ahead in a stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from agentrl.algos.advantages import compute_advantages, uses_role_baselines
from agentrl.algos.estimator import EstimatorInput
from agentrl.algos.gae import bootstrap_truncated
from agentrl.algos.kl_control import KLController
from agentrl.algos.losses import kl_penalty, masked_mean
from agentrl.algos.outcome_estimators import RoleBaselines, episode_scores
from agentrl.config import Config, to_dict
from agentrl.errors import CheckpointError, RolloutError
from agentrl.metrics import MetricsLogger, Timer, plot_curves, write_summary
from agentrl.rollout.collector import CollectResult, check_failed
from agentrl.rollout.filters import informative_groups, top_variance_groups, without_truncated
from agentrl.rollout.source import RolloutSource
from agentrl.rollout.stats import (
    by_tag,
    episode_stats,
    episodes,
    partial_replies,
    per_episode,
    tag_metrics,
    truncation_metrics,
)
from agentrl.tokenizer import Tokenizer
from agentrl.train.batch import Batch, need, pack
from agentrl.train.checkpoint import newest_readable, rng_state, save_checkpoint, set_rng_state
from agentrl.train.learner import Learner
from agentrl.train.watch import Watch
from agentrl.trajectory import Trajectory

ERRORS_NAME = "errors.jsonl"  # failed episode attempts of a run, one JSON line each


class Trainer:
    """Runs `Config.trainer.total_steps` steps of collect / update / sync (the local runtime's run
    handle: runtime/handle.py)."""

    def __init__(self, cfg: Config, actor: Learner, rollout: RolloutSource, tokenizer: Tokenizer, run_dir: Path,
                 eval_baselines: dict[str, Callable[[list[Trajectory]], dict[str, float]]] | None = None,
                 reference: Any = None, critic: Any = None) -> None:
        self.cfg = cfg
        self.actor = actor  # the policy it updates: an Actor, or Ray's ShardedActor
        self.rollout = rollout  # plays the episodes and serves the weights the actor trains
        self.tokenizer = tokenizer
        self.run_dir = Path(run_dir)
        self.eval_baselines = eval_baselines or {}  # per tag: reference policies to compare with
        self.val_tags = list(rollout.tasks.val_tags)
        self.reference = reference
        self.critic = critic
        self.kl_ctrl = KLController(cfg.algorithm.kl_ctrl)
        # RAE's running baseline per (game, role), kept only for an estimator that reads it
        alg = cfg.algorithm
        self.role_baselines = RoleBaselines(alg.rae_alpha) if uses_role_baselines(alg.adv_estimator) else None
        self.timer = Timer()
        self.step_idx = 0
        self.version = rollout.policy_version  # policy version of the weights the engine serves
        self.summary: dict[str, Any] = {}
        self.logger: MetricsLogger | None = None
        self.log: Callable[[str], None] = print  # warnings for the user (the CLI sends them to stderr)
        self.restored_from: Path | None = None  # the checkpoint a resume continued from
        self._restored = False
        self.watch = Watch(cfg, self.run_dir, tokenizer, actor, log=lambda m: self.log(m))  # dumps, alarms

    # ------------------------------------------------------------------ the loop
    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train to `total_steps`, evaluating before and after; returns the summary."""
        t0 = time.perf_counter()
        if resume and not self._restored:
            self.resume()
        self.logger = MetricsLogger(self.run_dir, loggers=self.cfg.trainer.logger,
                                    total_steps=self.cfg.trainer.total_steps,
                                    show_progress=self.cfg.trainer.progress,
                                    resume_from_step=self.step_idx if self.restored_from else None,
                                    run_name=self.cfg.exp_name, run_config=to_dict(self.cfg))
        if self.restored_from:
            self.watch.resumed(self.step_idx)
        try:
            if self.step_idx == 0:
                before = self.evaluate()
                self.summary["eval_success_before"] = before["eval/success"]
                self.summary.update(self._per_tag_summary(before, "before"))
                self.logger.log(0, before)
            if self.step_idx < self.cfg.trainer.total_steps:
                self.rollout.start()
            while self.step_idx < self.cfg.trainer.total_steps:
                self.step()
            after = self.evaluate()
            self.logger.log(self.step_idx, after)
            self._checkpoint()
        finally:
            self.rollout.close()
            self.logger.close()
        self.summary.update(
            eval_success_after=after["eval/success"],
            eval_optimum=after.get("eval/optimal_success", float("nan")),
            **{k.replace("eval/", "eval_"): v for k, v in after.items() if k.startswith("eval/baseline_")},
            **self._per_tag_summary(after, "after"),
            steps=self.step_idx,
            wall_seconds=round(time.perf_counter() - t0, 2),
        )
        write_summary(self.run_dir, self.summary)
        plot_curves(self.logger.history(), self.run_dir / "curves.png")
        return self.summary

    def step(self) -> dict[str, float]:
        """One training step; returns its metrics."""
        self.step_idx += 1
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        with self.timer.scope("collect"):
            result, filter_stats = self.collect()
        metrics.update(filter_stats)
        self._check_generated(result.trajectories, f"step {self.step_idx}")
        if result.trajectories:
            with self.timer.scope("pack"):
                batch = pack(result.trajectories, self._pad_token_id())
            with self.timer.scope("score"):
                self.score(batch)
            with self.timer.scope("reward"):
                metrics.update(self.reward(batch))
            with self.timer.scope("advantages"):
                batch.advantages, batch.returns = self.advantages(batch, result.trajectories)
                if self.role_baselines is not None:
                    metrics.update(self.role_baselines.metrics())
            with self.timer.scope("update"):
                if self.critic is not None:
                    metrics.update(self.critic.update(batch))
                metrics["policy/lr"] = self.actor.schedule(self.step_idx - 1, self.cfg.trainer.total_steps)
                metrics.update(self.actor.update(batch))
            if self.watch.dump_due(self.step_idx):
                with self.timer.scope("dump"):
                    self.watch.dump(self.step_idx, result.trajectories, batch, self.version)
            with self.timer.scope("sync"):
                self.sync()
            metrics.update(rollout_metrics(result, batch))
            metrics.update(tag_metrics(result.trajectories, "env"))
            with self.timer.scope("health"):
                metrics.update(self.watch.health(self.step_idx, result.trajectories, metrics))
        metrics.update(self.rollout.pop_metrics())
        if self._due(self.cfg.trainer.test_freq):
            with self.timer.scope("evaluate"):
                metrics.update(self.evaluate())
        metrics.update(self.timer.pop())
        metrics["perf/step_seconds"] = time.perf_counter() - t0
        # Logged before the checkpoint: a run killed between the two resumes with this step's
        # row in place (its checkpoint time is counted in the next step's perf/).
        self._metrics_logger().log(self.step_idx, metrics)
        self.watch.act(self.step_idx)  # warns of new alarms; on_collapse=stop rolls back and raises
        if self._due(self.cfg.trainer.save_freq):
            with self.timer.scope("checkpoint"):
                self._checkpoint()
        return metrics

    # ------------------------------------------------------------------ stages
    def collect(self) -> tuple[CollectResult, dict[str, float]]:
        """This step's groups, played by the current policy (or, with max_staleness k, by one at
        most k versions older), filtered as configured (rollout/filters.py).

        Failed episodes only drop their group, unless more than `rollout.max_failed_fraction` of
        the step's episodes failed: then the env or agent is broken and training stops.
        """
        fg = self.cfg.algorithm.filter_groups
        keep = partial(informative_groups, metric=fg.metric) if fg.enable else None
        step = self.rollout.collect(self.step_idx, self.version, keep, fg.max_num_gen_batches if fg.enable else 1)
        self._record_errors(step.result.errors)
        self._check_failures(step.result, f"step {self.step_idx}")
        groups, truncation = step.groups, {}
        if self.cfg.rollout.on_truncation == "drop":
            groups, dropped = without_truncated(groups)
            truncation = {"rollout/dropped_truncated": float(dropped)}  # none left: the step trains nothing
        kept = top_variance_groups(groups, self.cfg.rollout.rollout_filter_ratio)
        step.result.trajectories = [t for g in kept for t in g]
        curriculum = self.rollout.tasks.curriculum
        stats = {**step.stats, **truncation, "rollout/filtered_groups_std": float(len(groups) - len(kept)),
                 "rollout/kept_groups": float(len(kept)), **(curriculum.pop_stats() if curriculum else {})}
        return step.result, {**stats, **step.result.metrics(), **self._staleness(step.result.trajectories)}

    def _staleness(self, trajs: list[Trajectory]) -> dict[str, float]:
        """How many versions behind the trained policy each generated id of known version is (never
        above max_staleness); an unknown version (< 0) is no age (rollout/version_coverage counts it)."""
        lags = [self.version - v for t in trajs for v, m in zip(t.versions, t.loss_mask) if m and v >= 0]
        if not lags:
            return {}
        worst = max(lags)
        allowed = self.cfg.rollout.max_staleness if self.cfg.rollout.stale_samples == "correct" else 0
        assert worst <= allowed, f"step {self.step_idx}: a sample is {worst} versions stale (bound {allowed})"
        return {"rollout/staleness_mean": sum(lags) / len(lags), "rollout/staleness_max": float(worst)}

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
        kl = kl_penalty(need(batch.old_logprobs, "old_logprobs"), need(batch.ref_logprobs, "ref_logprobs"),
                        alg.kl_penalty) * batch.loss_mask
        batch.token_rewards = batch.token_rewards - self.kl_ctrl.value * kl
        seq_kl = (kl.sum(-1) / batch.loss_mask.sum(-1).clamp(min=1.0)).mean()
        coef = self.kl_ctrl.value
        self.kl_ctrl.update(float(seq_kl), n_steps=batch.size)
        return {"reward/kl_penalty": float(seq_kl), "reward/kl_coef": coef}

    def advantages(self, batch: Batch, trajs: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantages and returns from the configured estimator (`trajs`: the batch's rows, whose
        game and role key RAE's running baselines)."""
        alg, rewards = self.cfg.algorithm, batch.token_rewards
        if self.cfg.rollout.on_truncation == "bootstrap" and batch.values is not None and batch.truncated is not None:
            rewards = bootstrap_truncated(rewards, batch.values, batch.loss_mask, batch.truncated, alg.gamma)
        role_baselines = None
        if self.role_baselines is not None:
            scores = episode_scores(rewards, batch.loss_mask, alg)
            role_baselines = self.role_baselines.update([f"{t.tag}/{t.role}" for t in trajs], scores,
                                                        [t.segment == 0 for t in trajs])
        return compute_advantages(alg.adv_estimator, EstimatorInput(
            rewards, batch.loss_mask, batch.group_index, batch.values, alg, batch.state_ids,
            batch.reward_baselines, role_baselines))

    def sync(self) -> None:
        """Push the updated weights to the engine, so the next rollouts use them."""
        self.version = self.rollout.load_weights(self.actor.engine_weights())

    def evaluate(self) -> dict[str, float]:
        """Greedy episodes on held-out env seeds."""
        result = self.rollout.evaluate()
        trajs = result.trajectories
        self._record_errors(result.errors)  # training goes on; step 1 stops a run whose env always fails
        what = "evaluation" if self.step_idx == 0 else f"evaluation at step {self.step_idx}"
        check_failed(result, 1.0, what, str(self.run_dir / ERRORS_NAME))  # only when none is left to score
        self._check_generated(trajs, what)
        overall = episode_stats(trajs)
        out = {f"eval/{k}": overall[k] for k in ("success", "return", "turns", "optimal_success") if k in overall}
        out["eval/errors"] = float(len(result.errors))
        out.update(tag_metrics(trajs, "eval"))
        groups = by_tag(trajs)
        for tag, baselines in self.eval_baselines.items():
            # One tag keeps the historical key eval/baseline_<name>; several tags log per tag.
            where = "eval/" if len(set(self.val_tags)) == 1 else f"eval/{tag}/"
            if groups.get(tag):
                out.update({f"{where}baseline_{k}": v for k, v in baselines(episodes(groups[tag])).items()})
        self._write_samples(trajs[:2])
        return out

    def _check_failures(self, result: CollectResult, what: str) -> None:
        """Stop when more than rollout.max_failed_fraction of the episodes failed every attempt
        (or all of them did)."""
        check_failed(result, self.cfg.rollout.max_failed_fraction, what, str(self.run_dir / ERRORS_NAME))

    def _check_generated(self, trajs: list[Trajectory], what: str) -> None:
        """Episodes that all ended before the policy generated a token train nothing: a run of
        them would exit 0 having learned nothing, so it stops here with the reason."""
        if not trajs or any(t.num_generated for t in trajs):
            return
        reasons = ", ".join(sorted({str(t.truncation_reason) for t in trajs}))
        r = self.cfg.rollout
        raise RolloutError(
            f"{what}: none of the {len(trajs)} episodes generated a token (truncation_reason: {reasons}): the "
            f"first prompt leaves no room for a reply of rollout.max_new_tokens={r.max_new_tokens} within the "
            f"context (rollout.max_model_len={r.max_model_len}, 0 = the model's); raise rollout.max_model_len or "
            "shorten the env's first observation")

    def _record_errors(self, errors: list[str]) -> None:
        """Append this step's failed attempts to errors.jsonl (the run keeps going without them)."""
        import json

        if not errors:
            return
        with open(self.run_dir / ERRORS_NAME, "a") as f:
            for e in errors:
                kind, _, message = e.partition(": ")
                f.write(json.dumps({"step": self.step_idx, "kind": kind, "error": message}) + "\n")

    def _write_samples(self, trajs: list[Trajectory]) -> None:
        """Append a few decoded eval episodes to samples.jsonl, for people to read."""
        import json

        with open(self.run_dir / "samples.jsonl", "a") as f:
            for t in trajs:
                text = self.tokenizer.decode(t.token_ids, skip_special_tokens=False)
                f.write(json.dumps({"step": self.step_idx, "reward": t.total_reward,
                                    "success": t.success, "text": text}) + "\n")

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint(self) -> None:
        # The source drops every cached prefix first (kv_on_weight_update=keep keeps them across
        # a weight update): the engine continues from the state a resumed run starts in.
        curriculum = self.rollout.tasks.curriculum  # its estimates steer the draws of the steps to come
        state = {"policy_version": self.version, **self.rollout.checkpoint(),
                 "rng": rng_state(), "summary": dict(self.summary),
                 "kl_coef": self.kl_ctrl.value, "health": self.watch.monitor.state_dict(),
                 "role_baselines": self.role_baselines.state_dict() if self.role_baselines is not None else None,
                 "master_weights": self.actor.master.state_dict(),
                 "curriculum": curriculum.state_dict() if curriculum is not None else None,
                 "critic": self.critic.state_dict() if self.critic is not None else None}
        save_checkpoint(self.run_dir / "checkpoints", self.step_idx, self.actor.model, self.tokenizer,
                        self.actor.optimizer, state, keep=self.cfg.trainer.max_checkpoints, config=self.cfg)

    def resume(self) -> None:
        """Continue from the run folder's newest readable checkpoint (none: stay at step 0)."""
        self._restored = True
        # The newest checkpoint that loads: a torn or corrupt newer one is skipped with a warning.
        found = newest_readable(self.run_dir / "checkpoints", self.log)
        if found is None:
            return
        ckpt, (weights, optimizer_state, state) = found
        try:
            self.actor.load_state(weights, optimizer_state, state.get("master_weights"))
        except (RuntimeError, ValueError, KeyError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise CheckpointError(f"checkpoint {ckpt} does not fit this run's model: {first}") from None
        self.restored_from = ckpt
        self.step_idx = int(state["step"])
        self.summary = dict(state.get("summary", {}))
        self.kl_ctrl.value = float(state.get("kl_coef", self.kl_ctrl.value))
        if self.role_baselines is not None:
            self.role_baselines.load_state_dict(state.get("role_baselines") or {})
        if state.get("health"):
            self.watch.monitor.load_state_dict(state["health"])
        if self.critic is not None and state.get("critic") is not None:
            self.critic.load_state_dict(state["critic"])
        if self.rollout.tasks.curriculum is not None and state.get("curriculum") is not None:
            self.rollout.tasks.curriculum.load_state_dict(state["curriculum"])
        set_rng_state(state["rng"])
        self.sync()
        self.version = int(state["policy_version"])
        self.rollout.restore({"engine": state["engine"], "stream": state.get("stream")})

    def _per_tag_summary(self, evaluation: dict[str, float], when: str) -> dict[str, float]:
        """eval_<tag>_success_<when> (and baselines) for runs that mix several tags."""
        if len(set(self.val_tags)) < 2:
            return {}
        out = {}
        for tag in dict.fromkeys(self.val_tags):
            for key in ("success", "return"):
                if f"eval/{tag}/{key}" in evaluation:
                    out[f"eval_{tag}_{key}_{when}"] = evaluation[f"eval/{tag}/{key}"]
            if when == "after":
                out.update({f"eval_{tag}_{k[len(f'eval/{tag}/'):]}": v for k, v in evaluation.items()
                            if k.startswith(f"eval/{tag}/baseline_")})
        return out

    def _pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        if pad is None:  # agentrl's model loading gives every tokenizer one (EOS where it ships none)
            raise ValueError("the tokenizer has no pad token id: set its pad_token (e.g. to its EOS token)")
        return pad

    def _metrics_logger(self) -> MetricsLogger:
        if self.logger is None:
            raise RuntimeError("Trainer.step runs inside Trainer.fit, which opens the metrics logger")
        return self.logger

    def _due(self, freq: int) -> bool:
        return freq > 0 and self.step_idx % freq == 0 and self.step_idx < self.cfg.trainer.total_steps


def rollout_metrics(result: CollectResult, batch: Batch) -> dict[str, float]:
    """rollout/* and reward/* metrics of one step's trajectories."""
    trajs = result.trajectories
    eps = episodes(trajs)  # an episode played as several sequences counts once
    rewards = torch.tensor([t.total_reward for t in eps])
    mask = batch.loss_mask
    diff = (batch.behaviour_logprobs - need(batch.old_logprobs, "old_logprobs")).abs() * mask
    extra = {}
    if batch.reward_baselines is not None:  # ReMax's greedy episodes (played, not trained)
        extra["reward/greedy_baseline"] = float(batch.reward_baselines.nanmean())
    for role in sorted({t.role for t in trajs if t.role}):  # a game's seats: each seat's ids as its engine sampled them
        rows = torch.tensor([t.role == role for t in trajs])
        extra[f"policy/logprob_diff_max/{role}"] = float(diff[rows].max())
    return {
        **extra,
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(eps) > 1 else 0.0,
        "reward/max": float(rewards.max()),
        "reward/min": float(rewards.min()),
        "rollout/success": _mean([float(t.success) for t in eps]),
        "rollout/turns": per_episode(trajs, lambda t: t.num_turns),
        "rollout/invalid_actions": per_episode(trajs, lambda t: t.invalid_actions),
        "rollout/truncated_replies": per_episode(trajs, lambda t: t.truncated_replies),
        "rollout/response_tokens": per_episode(trajs, lambda t: t.num_generated),
        "rollout/sequence_tokens": _mean([len(t.token_ids) for t in trajs]),
        "rollout/episodes": float(len(eps)),
        "rollout/partial_replies": float(sum(partial_replies(t) for t in trajs)),
        **truncation_metrics(trajs),
        "policy/logprob_diff_mean": float(masked_mean(diff, mask)),
        "policy/logprob_diff_max": float(diff.max()),
    }


def _mean(xs: list[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0
