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

import torch

from agentrl.config import Config
from agentrl.dumps import TrajectoryDumper, cut_dumps
from agentrl.errors import CollapseError
from agentrl.health import (
    MIN_INPUTS,
    Alarm,
    Monitor,
    cross_inputs,
    group_signals,
    input_dependence,
    reply_repeat,
    tool_signals,
)
from agentrl.tokenizer import Tokenizer
from agentrl.train.batch import Batch
from agentrl.train.checkpoint import list_checkpoints, step_of
from agentrl.train.learner import Learner
from agentrl.trajectory import Trajectory

COLLAPSED_PREFIX = "collapsed_"


class Watch:
    """Dumps and health checks of one run."""

    def __init__(self, cfg: Config, run_dir: Path, tokenizer: Tokenizer, actor: Learner,
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
        self.mi_off: str | None = None  # why health/input_dependence stopped, if it did

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
        signals = {**group_signals(trajs), **reply_repeat(trajs), **tool_signals(trajs)}
        if "policy/entropy" in metrics:
            signals["health/entropy"] = metrics["policy/entropy"]
        n = self.cfg.health.mi_inputs
        pairs = cross_inputs(trajs, n) if n and self.mi_off is None else []
        if len(pairs) >= MIN_INPUTS:
            try:
                signals.update(input_dependence(self.cross_loglik(pairs)))
            except (TypeError, ValueError, RuntimeError, AttributeError) as e:
                # A model whose forward takes no KV cache or position ids: the run goes on without it.
                self.mi_off = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
                self.log(f"agentrl: warning: health/input_dependence is off for this run (the policy's forward "
                         f"does not take a shared KV cache: {self.mi_off}); set health.mi_inputs=0 to silence this")
        success = metrics.get("rollout/success", 0.0)  # a solved task may turn certain: no entropy alarm
        extra, self.pending = self.monitor.observe(step, {**signals, "rollout/success": success})
        return {**signals, **extra, **self.monitor.active(), "health/alarms": float(len(self.pending))}

    @torch.no_grad()
    def cross_loglik(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[list[float]]:
        """loglik[i][j] = log p(reply_i | context_j) under the current policy.

        A pass holds a few contexts (left-padded, one forward) and then every reply after each
        of them on the contexts' KV cache: n contexts and n*n reply ids are computed, never n*n
        whole sequences, in about 4 * actor.micro_batch_size rows at a time."""
        model, device, temperature = self.actor.model, self.actor.device, self.actor.temperature
        model.eval()
        replies = [r for _, r in pairs]
        n, width = len(replies), max(len(r) for r in replies)
        reply_ids = torch.zeros((n, width), dtype=torch.long)  # right-padded: pads only follow a reply
        for i, reply in enumerate(replies):
            reply_ids[i, :len(reply)] = torch.tensor(reply)
        per_pass = max(1, 4 * self.cfg.actor.micro_batch_size // n)  # contexts per pass (times n rows)
        out = [[0.0] * n for _ in range(n)]
        for start in range(0, n, per_pass):
            contexts = [c for c, _ in pairs[start:start + per_pass]]
            g, length = len(contexts), max(len(c) for c in contexts)
            ids = torch.zeros((g, length), dtype=torch.long)
            mask = torch.zeros((g, length), dtype=torch.long)
            for k, context in enumerate(contexts):  # left-padded: each context ends in the last column
                ids[k, length - len(context):] = torch.tensor(context)
                mask[k, length - len(context):] = 1
            first = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                          position_ids=(mask.cumsum(-1) - 1).clamp(min=0).to(device), use_cache=True)
            cache = first.past_key_values
            cache.batch_repeat_interleave(n)  # row k*n + i: reply i after context k
            rows = reply_ids.repeat(g, 1)
            positions = mask.sum(-1).repeat_interleave(n).unsqueeze(1) + torch.arange(width)
            rest = model(input_ids=rows.to(device), past_key_values=cache, use_cache=False,
                         attention_mask=torch.cat([mask.repeat_interleave(n, 0), torch.ones_like(rows)], 1).to(device),
                         position_ids=positions.to(device)).logits
            # the context's last position predicts a reply's first id, the reply's own ids the rest
            logits = torch.cat([first.logits[:, -1:].repeat_interleave(n, 0), rest[:, :-1]], dim=1).float()
            logp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, rows.to(device).unsqueeze(-1))
            logp = logp.squeeze(-1).cpu()
            for k in range(g):
                for i, reply in enumerate(replies):
                    out[i][start + k] = float(logp[k * n + i, :len(reply)].sum())
        return out

    def act(self, step: int) -> None:
        """Warn about the alarms that started at `step`; with on_collapse=stop, roll back and stop."""
        alarms, self.pending = self.pending, []
        if not alarms:
            return
        for alarm in alarms:
            self.log(alarm.line())
        if self.cfg.trainer.on_collapse != "stop":
            return
        onset = self.monitor.onset if self.monitor.onset is not None else step
        moved = self.roll_back(onset)
        kept = list_checkpoints(self.run_dir / "checkpoints")
        where = (f"the newest checkpoint is now {kept[-1].name}, the last before the first bad step {onset}"
                 if kept else f"no checkpoint precedes the first bad step {onset}")
        aside = f" ({len(moved)} later ones moved to checkpoints/{COLLAPSED_PREFIX}*)" if moved else ""
        names = ", ".join(a.name for a in alarms)
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
