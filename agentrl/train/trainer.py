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
from agentrl.errors import CheckpointError, RolloutError
from agentrl.metrics import MetricsLogger, Timer, plot_curves, write_summary
from agentrl.rollout.collector import CollectResult, RolloutCollector, make_tasks
from agentrl.rollout.stats import by_tag, episode_stats, tag_metrics, truncation_metrics
from agentrl.rollout.stream import RolloutStream
from agentrl.rollout.trajectory import Task, Trajectory
from agentrl.train.actor import Actor
from agentrl.train.batch import Batch, pack
from agentrl.train.checkpoint import newest_readable, rng_state, save_checkpoint, set_rng_state

EVAL_SEED_BASE = 1_000_000  # eval env seeds live above every training seed
GEN_BATCH_STRIDE = 1_000_003  # extra generation batches of a step draw seeds far from other steps
EVAL_STEP = 2**31 - 1  # a fixed pseudo-step: every evaluation plays the same held-out tasks
ERRORS_NAME = "errors.jsonl"  # failed episode attempts of a run, one JSON line each


class Trainer:
    """Runs `Config.trainer.total_steps` steps of collect / update / sync."""

    def __init__(self, cfg: Config, actor: Actor, engine: Any, collector: RolloutCollector,
                 tokenizer: Any, run_dir: Path,
                 eval_baselines: dict[str, Callable[[list[Trajectory]], dict[str, float]]] | None = None,
                 reference: Any = None, critic: Any = None) -> None:
        self.cfg = cfg
        self.actor = actor
        self.engine = engine
        self.collector = collector
        self.tokenizer = tokenizer
        self.run_dir = Path(run_dir)
        self.eval_baselines = eval_baselines or {}  # per tag: reference policies to compare with
        self.train_tags = cfg.group_tags("train")  # the env definition of each group of a batch
        self.val_tags = cfg.group_tags("val")
        self.reference = reference
        self.critic = critic
        self.kl_ctrl = KLController(cfg.algorithm.kl_ctrl)
        self.timer = Timer()
        self.step_idx = 0
        self.version = engine.policy_version  # policy version of the weights the engine serves
        self.stream: RolloutStream | None = None  # the background rollout, when max_staleness >= 1
        self._stream_state: dict[str, Any] | None = None  # task-source position of a resumed stream
        self.summary: dict[str, Any] = {}
        self.logger: MetricsLogger | None = None
        self.log: Callable[[str], None] = print  # warnings for the user (the CLI sends them to stderr)
        self.restored_from: Path | None = None  # the checkpoint a resume continued from
        self._restored = False

    # ------------------------------------------------------------------ the loop
    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train to `total_steps`, evaluating before and after; returns the summary."""
        t0 = time.perf_counter()
        if resume and not self._restored:
            self._restore()
        self.logger = MetricsLogger(self.run_dir, loggers=self.cfg.trainer.logger,
                                    total_steps=self.cfg.trainer.total_steps,
                                    show_progress=self.cfg.trainer.progress,
                                    resume_from_step=self.step_idx if self.restored_from else None)
        try:
            if self.step_idx == 0:
                before = self.evaluate()
                self.summary["eval_success_before"] = before["eval/success"]
                self.summary.update(self._per_tag_summary(before, "before"))
                self.logger.log(0, before)
            self._start_stream()
            while self.step_idx < self.cfg.trainer.total_steps:
                self.step()
            after = self.evaluate()
            self.logger.log(self.step_idx, after)
            self._checkpoint()
        finally:
            if self.stream is not None:
                self.stream.close()
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
            metrics.update(tag_metrics(result.trajectories, "env"))
        metrics.update(self._on_engine(self.engine.stats.pop))
        if self._due(self.cfg.trainer.test_freq):
            with self.timer.scope("evaluate"):
                metrics.update(self.evaluate())
        metrics.update(self.timer.pop())
        metrics["perf/step_seconds"] = time.perf_counter() - t0
        # Logged before the checkpoint: a run killed between the two resumes with this step's
        # row in place (its checkpoint time is counted in the next step's perf/).
        self.logger.log(self.step_idx, metrics)
        if self._due(self.cfg.trainer.save_freq):
            with self.timer.scope("checkpoint"):
                self._checkpoint()
        return metrics

    # ------------------------------------------------------------------ stages
    def collect(self) -> tuple[CollectResult, dict[str, float]]:
        """This step's groups, played by the current policy (or, with max_staleness k, by one at
        most k versions older), filtered as configured.

        With DAPO's `filter_groups` and `max_num_gen_batches` > 1, further batches (fresh env
        seeds) are collected until the step has `batch_size / group_size` informative groups.
        Failed episodes only drop their group, unless more than `rollout.max_failed_fraction` of
        the step's episodes failed: then the env or agent is broken and training stops.
        """
        r, fg = self.cfg.rollout, self.cfg.algorithm.filter_groups
        n_groups = r.batch_size // r.group_size
        kept: list[list[Trajectory]] = []
        total = CollectResult([])
        dropped_equal = stale = 0
        batches = max(1, fg.max_num_gen_batches) if fg.enable else 1
        for attempt in range(batches):
            groups, result, n_stale = self._generate(attempt, n_groups)
            total.absorb(result)
            stale += n_stale
            informative = [g for g in groups
                           if not fg.enable or len({_group_metric(t, fg.metric) for t in g}) > 1]
            dropped_equal += len(groups) - len(informative)
            if self.stream is not None:
                self.stream.replace(len(groups) - len(informative))
            kept += informative
            if len(kept) >= n_groups:
                break
        self._record_errors(total.errors)
        self._check_failures(total, f"step {self.step_idx}")
        kept = kept[:n_groups]
        n_before_std = len(kept)
        if r.rollout_filter_ratio < 1.0 and kept:
            k = max(1, math.ceil(r.rollout_filter_ratio * len(kept)))
            stds = [float(torch.tensor([t.total_reward for t in g]).std()) if len(g) > 1 else 0.0 for g in kept]
            order = sorted(range(len(kept)), key=lambda i: -stds[i])[:k]
            kept = [kept[i] for i in sorted(order)]
        total.trajectories = [t for g in kept for t in g]
        stats = {"rollout/gen_batches": float(attempt + 1),
                 "rollout/filtered_groups_equal": float(dropped_equal),
                 "rollout/filtered_groups_std": float(n_before_std - len(kept)),
                 "rollout/kept_groups": float(len(kept)),
                 "rollout/stale_dropped_groups": float(stale),
                 **total.metrics(), **self._staleness(total.trajectories)}
        return total, stats

    def _generate(self, attempt: int, need: int) -> tuple[list[list[Trajectory]], CollectResult, int]:
        """One generation batch: its complete groups, its counts, and how many groups were too stale.

        On-policy, a fresh batch of the step's tasks; with a stream, the first `need` groups to
        finish (older ones beyond the staleness bound are dropped by the stream).
        """
        if self.stream is None:
            n_groups = self.cfg.rollout.batch_size // self.cfg.rollout.group_size
            tasks = make_tasks(self.cfg.seed, self.step_idx + attempt * GEN_BATCH_STRIDE, n_groups,
                               self.cfg.rollout.group_size, tags=self.train_tags)
            # Group ids must stay distinct across generation batches: baselines are per group.
            tasks = [replace(t, group_id=t.group_id + attempt * n_groups) for t in tasks]
            result = self.collector.collect(tasks)
            return _groups(result.trajectories), result, 0
        ready, stale = self.stream.take(need, self.version)
        result = CollectResult([])
        for group in ready:
            result.absorb(group.result)
        return [g.trajectories for g in ready if not g.failed], result, stale

    def _staleness(self, trajs: list[Trajectory]) -> dict[str, float]:
        """How many versions behind the trained policy each generated id is (never above max_staleness)."""
        lags = [self.version - v for t in trajs for v, m in zip(t.versions, t.loss_mask) if m]
        if not lags:
            return {}
        worst = max(lags)
        allowed = self.cfg.rollout.max_staleness if self.cfg.rollout.stale_samples == "correct" else 0
        assert worst <= allowed, f"step {self.step_idx}: a sample is {worst} versions stale (bound {allowed})"
        return {"rollout/staleness_mean": sum(lags) / len(lags), "rollout/staleness_max": float(worst)}

    def _group_tasks(self, index: int) -> list[Task]:
        """The tasks of group `index` of the task source: the same env seeds as on-policy step
        index // G + 1 plays, so both modes train on one sequence of tasks."""
        r = self.cfg.rollout
        n_groups = r.batch_size // r.group_size
        step, g = divmod(index, n_groups)
        tasks = make_tasks(self.cfg.seed, step + 1, n_groups, r.group_size,
                           tags=self.train_tags)[g * r.group_size:(g + 1) * r.group_size]
        return [replace(t, group_id=index) for t in tasks]

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
        weights = {k: v.detach() for k, v in self.actor.model.state_dict().items()}
        if self.stream is None:
            self.version = self.engine.load_weights(weights)
        else:
            self.version = self.stream.load_weights(weights)

    def evaluate(self) -> dict[str, float]:
        """Greedy episodes on held-out env seeds."""
        n = self.cfg.trainer.eval_episodes
        tasks = make_tasks(self.cfg.seed, EVAL_STEP, n, 1, greedy=True, seed_base=EVAL_SEED_BASE,
                           tags=self.val_tags)
        # With a stream the engine belongs to its thread: evaluation runs there too.
        result = self.collector.collect(tasks) if self.stream is None else self.stream.run(self.collector.acollect(tasks))
        trajs = result.trajectories
        self._record_errors(result.errors)  # training goes on; step 1 stops a run whose env always fails
        self._check_generated(trajs, "evaluation" if self.step_idx == 0 else f"evaluation at step {self.step_idx}")
        overall = episode_stats(trajs)
        out = {f"eval/{k}": overall[k] for k in ("success", "return", "turns", "optimal_success") if k in overall}
        out["eval/errors"] = float(len(result.errors))
        out.update(tag_metrics(trajs, "eval"))
        groups = by_tag(trajs)
        for tag, baselines in self.eval_baselines.items():
            # One tag keeps the historical key eval/baseline_<name>; several tags log per tag.
            where = "eval/" if len(set(self.val_tags)) == 1 else f"eval/{tag}/"
            if groups.get(tag):
                out.update({f"{where}baseline_{k}": v for k, v in baselines(groups[tag]).items()})
        self._write_samples(trajs[:2])
        # Evaluation leaves the engine as it found it: its parked prefixes and counters would
        # otherwise shape the next step's batches, which a run resumed after this step never sees.
        self._on_engine(self._forget_evaluation)
        return out

    def _forget_evaluation(self) -> None:
        """Drop the prefixes and counters an evaluation left in an idle engine."""
        if self.engine.reset_prefix_cache():
            self.engine.stats.pop()

    def _check_failures(self, result: CollectResult, what: str) -> None:
        """Stop when more than rollout.max_failed_fraction of the episodes failed every attempt."""
        fraction = self.cfg.rollout.max_failed_fraction
        if result.failed_episodes > fraction * result.episodes:
            raise RolloutError(
                f"{what}: {result.failed_episodes} of {result.episodes} episodes failed every "
                f"attempt (more than rollout.max_failed_fraction={fraction}); first error: "
                f"{result.errors[0]}; all errors are in {self.run_dir / ERRORS_NAME}")

    def _check_generated(self, trajs: list[Trajectory], what: str) -> None:
        """Episodes that all ended before the policy generated a token train nothing: a run of
        them would exit 0 having learned nothing, so it stops here with the reason."""
        if not trajs or any(t.num_generated for t in trajs):
            return
        reasons = ", ".join(sorted({str(t.info.get("truncation_reason")) for t in trajs}))
        r = self.cfg.rollout
        raise RolloutError(
            f"{what}: none of the {len(trajs)} episodes generated a token (truncation_reason: {reasons}): the "
            f"first prompt leaves no room for a reply of rollout.max_new_tokens={r.max_new_tokens} within the "
            f"context (rollout.max_model_len={r.max_model_len}, 0 = the model's); raise rollout.max_model_len or "
            "shorten the env's first observation")

    def _start_stream(self) -> None:
        """Start the background rollout when training may use samples of older policies."""
        r = self.cfg.rollout
        if r.max_staleness == 0 or self.step_idx >= self.cfg.trainer.total_steps:
            return
        self.stream = RolloutStream(self.collector, self._group_tasks, r.batch_size // r.group_size,
                                    r.max_staleness, version=self.version, consumed=self._stream_state,
                                    accept_stale=r.stale_samples == "correct")
        self.stream.start()

    def _on_engine(self, fn: Callable[[], Any]) -> Any:
        """Call `fn` where the engine lives: here, or on the stream's thread."""
        return fn() if self.stream is None else self.stream.call(fn)

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
                                    "success": bool(t.info.get("success")), "text": text}) + "\n")

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint(self) -> None:
        # No cached prefix survives a checkpoint (kv_on_weight_update=keep keeps them across a
        # weight update): the engine continues from the state a resumed run starts in.
        self._on_engine(self.engine.reset_prefix_cache)
        state = {"policy_version": self.version, "engine": self._on_engine(self.engine.state_dict),
                 "rng": rng_state(), "summary": dict(self.summary),
                 "stream": self.stream.state() if self.stream is not None else None,
                 "kl_coef": self.kl_ctrl.value,
                 "critic": self.critic.state_dict() if self.critic is not None else None}
        save_checkpoint(self.run_dir / "checkpoints", self.step_idx, self.actor.model, self.tokenizer,
                        self.actor.optimizer, state, keep=self.cfg.trainer.max_checkpoints)

    def _restore(self) -> None:
        self._restored = True
        # The newest checkpoint that loads: a torn or corrupt newer one is skipped with a warning.
        found = newest_readable(self.run_dir / "checkpoints", self.log)
        if found is None:
            return
        ckpt, (weights, optimizer_state, state) = found
        try:
            self.actor.model.load_state_dict(weights, strict=False)
            self.actor.optimizer.load_state_dict(optimizer_state)
        except (RuntimeError, ValueError, KeyError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise CheckpointError(f"checkpoint {ckpt} does not fit this run's model: {first}") from None
        self.restored_from = ckpt
        self.step_idx = int(state["step"])
        self.summary = dict(state.get("summary", {}))
        self.kl_ctrl.value = float(state.get("kl_coef", self.kl_ctrl.value))
        if self.critic is not None and state.get("critic") is not None:
            self.critic.load_state_dict(state["critic"])
        set_rng_state(state["rng"])
        self.sync()
        self.version = int(state["policy_version"])
        self._stream_state = state.get("stream")
        # Checkpoints written before the engine had a state API kept its seed stream as engine_rng.
        self.engine.load_state_dict(state.get("engine") or {"policy_version": self.version,
                                                            "seed_rng": state["engine_rng"]})

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
        **truncation_metrics(trajs),
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
