"""What the trainer watches each step: trajectory dumps (agentrl/dumps.py) and the collapse alarms
(agentrl/health.py), with what an alarm does (`trainer.on_collapse`).

Two stages of `Trainer.step` call it: `dump` after the update (the batch then holds every number
the step trained with), and `health` once the step's metrics are known. On `stop`, checkpoints
written since the first bad step of the alarm's run are moved aside (`checkpoints/collapsed_*`),
so the newest checkpoint is the last healthy one and `agentrl resume` continues from there.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from agentrl.config import Config
from agentrl.dumps import TrajectoryDumper, cut_dumps
from agentrl.errors import CollapseError
from agentrl.health import MIN_INPUTS, Alarm, Monitor, cross_inputs, group_signals, input_dependence, reply_repeat
from agentrl.trajectory import Trajectory
from agentrl.train.actor import Actor, token_logprobs
from agentrl.train.batch import Batch
from agentrl.train.checkpoint import list_checkpoints, step_of

COLLAPSED_PREFIX = "collapsed_"


class Watch:
    """Dumps and health checks of one run."""

    def __init__(self, cfg: Config, run_dir: Path, tokenizer: Any, actor: Actor,
                 log: Callable[[str], None] = print) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.actor = actor
        self.log = log
        t = cfg.trainer
        self.dumper = (TrajectoryDumper(run_dir, tokenizer, t.dump_max_tokens) if t.dump_trajectories_freq > 0
                       else None)
        self.monitor = Monitor(cfg.health)
        self.pending: list[Alarm] = []  # alarms of the step being logged

    # ------------------------------------------------------------------ dumps
    def dump_due(self, step: int) -> bool:
        """Whether `step` is dumped (every trainer.dump_trajectories_freq steps, and the last)."""
        freq = self.cfg.trainer.dump_trajectories_freq
        return freq > 0 and (step % freq == 0 or step == self.cfg.trainer.total_steps)

    def dump(self, step: int, trajs: Sequence[Trajectory], batch: Batch, policy_version: int) -> None:
        """Write the step's dump (the caller checks dump_due)."""
        assert self.dumper is not None, "dump called with trainer.dump_trajectories_freq=0"
        self.dumper.write(step, trajs, batch, policy_version, self.cfg.algorithm.adv_estimator)

    def resumed(self, step: int) -> None:
        """A resume continues after `step`: dumps past it belong to steps it will replay."""
        cut_dumps(self.run_dir, step)

    # ------------------------------------------------------------------ health
    def health(self, step: int, trajs: Sequence[Trajectory], metrics: dict[str, float]) -> dict[str, float]:
        """The step's health/ metrics; alarms that start here are kept for `act`."""
        if not self.cfg.health.enable:
            return {}
        signals = {**group_signals(trajs), **reply_repeat(trajs)}
        if "policy/entropy" in metrics:
            signals["health/entropy"] = metrics["policy/entropy"]
        n = self.cfg.health.mi_inputs
        pairs = cross_inputs(trajs, n) if n >= 2 else []
        if len(pairs) >= MIN_INPUTS:
            signals.update(input_dependence(self.cross_loglik(pairs)))
        extra, self.pending = self.monitor.observe(step, {**signals, "rollout/success": metrics.get("rollout/success",
                                                                                                  0.0)})
        return {**signals, **extra, **self.monitor.active(), "health/alarms": float(len(self.pending))}

    @torch.no_grad()
    def cross_loglik(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[list[float]]:
        """loglik[i][j] = log p(reply_i | context_j) under the current policy (n*n sequences)."""
        model = self.actor.model
        model.eval()
        longest = max(len(c) + len(r) for c, r in pairs)  # no sequence grows past the longest real one
        seqs = []
        for reply in (r for _, r in pairs):
            for context, _ in pairs:
                context = context[max(0, len(context) + len(reply) - longest):]
                seqs.append((context, reply))
        out: list[float] = []
        size = self.actor.cfg.micro_batch_size
        for start in range(0, len(seqs), size):
            chunk = seqs[start:start + size]
            width = max(len(c) + len(r) for c, r in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            attn = torch.zeros_like(ids)
            for k, (c, r) in enumerate(chunk):
                ids[k, :len(c) + len(r)] = torch.tensor(c + r)
                attn[k, :len(c) + len(r)] = 1
            logp = token_logprobs(model, ids.to(self.actor.device), attn.to(self.actor.device),
                                  self.actor.temperature).cpu()
            for k, (c, r) in enumerate(chunk):
                out.append(float(logp[k, len(c):len(c) + len(r)].sum()))
        n = len(pairs)
        return [out[i * n:(i + 1) * n] for i in range(n)]

    def act(self, step: int) -> None:
        """Warn about the alarms that started at `step`; with on_collapse=stop, roll back and stop."""
        if not self.pending:
            return
        for alarm in self.pending:
            self.log(alarm.line())
        if self.cfg.trainer.on_collapse != "stop":
            return
        onset = self.monitor.onset if self.monitor.onset is not None else step
        moved = self.roll_back(onset)
        kept = list_checkpoints(self.run_dir / "checkpoints")
        where = (f"the newest checkpoint is now {kept[-1].name}, the last before the first bad step {onset}"
                 if kept else f"no checkpoint precedes the first bad step {onset}")
        aside = f" ({len(moved)} later ones moved to checkpoints/{COLLAPSED_PREFIX}*)" if moved else ""
        names = ", ".join(a.name for a in self.pending)
        raise CollapseError(
            f"stopped at step {step} on collapse alarm {names} (trainer.on_collapse=stop): {where}{aside}; look at "
            f"the trajectories with `agentrl view {self.run_dir}`; `agentrl resume {self.run_dir} "
            "trainer.on_collapse=warn` continues from there")

    def roll_back(self, onset: int) -> list[Path]:
        """Move the checkpoints of steps >= `onset` aside; returns their new paths."""
        moved = []
        root = self.run_dir / "checkpoints"
        for ckpt in list_checkpoints(root):
            if step_of(ckpt) >= onset:
                target = root / f"{COLLAPSED_PREFIX}{ckpt.name}"
                if target.exists():
                    shutil.rmtree(target)
                ckpt.rename(target)
                moved.append(target)
        return moved
