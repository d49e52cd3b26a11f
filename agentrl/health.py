"""Collapse alarms: cheap per-step signals of a run going wrong, under `health/`, and the alarms
they raise when they cross the thresholds of the `health` config section.

Signals (each from the step's own episodes, nothing extra generated):
- `health/dead_groups`: fraction of groups whose episodes all got the same reward without all
  succeeding: no learning signal left there (a group-relative advantage is 0). A group that
  all succeeded is solved, not dead, so a converged run does not count. Also logged:
  `health/zero_std_groups` (every group of equal rewards) and `health/reward_std_in_group`.
- `health/entropy`: the policy's mean token entropy on generated ids (the update's
  `policy/entropy`), and `health/entropy_ratio`, its ratio to the mean of the warm-up steps.
- `health/reply_repeat`: the chance that two turns with different inputs (the observation the
  turn acted on) got the very same reply ids: RAGEN's "echo trap" drives it to 1. With k
  equally likely valid actions a healthy policy sits near 1/k or above, not at 1.
- `health/input_dependence`: how much replies depend on their input, RAGEN-2's mutual
  information idea estimated cheaply: n distinct inputs and their replies are cross-scored
  (log p(reply_i | input_j): n contexts, each reply scored on their KV cache, `health.mi_inputs`), and
  I = mean_i[log p(y_i|x_i) - log mean_j p(y_i|x_j)], divided by its maximum log n, is in [0, 1].
  `health/input_retrieval`: how often a reply is likeliest under its own input (chance: 1/n).
  Left out when a step has fewer than `MIN_INPUTS` distinct inputs; alarms compare its moving
  average, `health/input_dependence_smooth`, with the average's peak.
  Entropy cannot see template collapse (varied replies that ignore the input); this can.
- `health/malformed_calls`: the share of the step's tool calls (`tools/calls` of the tool agent's
  episodes, agentrl/agents/tool.py) that were malformed; alarms compare its moving average,
  `health/malformed_calls_smooth`, with the lowest that average had reached.
- On tasks declared to need tools (episodes whose `info["needs_tools"]` is true: the tool agent
  sets it when its env has `needs_tools = True` or `agent.args.needs_tools=true`, and it offers
  tools): `health/tool_use`, the share of those episodes that called a tool, and
  `health/tool_task_reward`, their mean return (moving average: `health/tool_task_reward_smooth`).

Alarms (names in `ALARMS`): a signal must be bad for `health.patience` consecutive steps after
`health.warmup_steps`; the alarm is then logged as one line and `health/alarm_<name>` is 1 while
it lasts. An untrained policy does not depend on its input either, so `input_dependence` alarms
only on a drop from a peak the run had reached; an untrained one writes malformed calls too, so
`malformed_calls` alarms on a rise from the lowest share the run had reached. The signals whose
single steps are noisy are compared as moving averages (`Monitor.trend`), one mechanism for all.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import ConfigError
from agentrl.trajectory import Trajectory

ALARMS = ("dead_groups", "entropy", "reply_repeat", "input_dependence", "malformed_calls", "reward_without_tools")
SMOOTHING = 0.7  # weight of the past in a signal's moving average (an exponential moving average)
MIN_INPUTS = 4  # fewer distinct inputs than this give no input-dependence estimate (too noisy)


@dataclass
class HealthConfig:
    """Collapse alarms: the thresholds of the health/ signals (see agentrl/health.py)."""

    enable: bool = True
    """Compute the health/ signals and raise alarms (trainer.on_collapse says what an alarm does)."""
    warmup_steps: int = 3
    """Steps that only set the references (the entropy baseline) before any alarm can fire."""
    patience: int = 2
    """Consecutive bad steps before an alarm fires (one noisy step is not a collapse)."""
    dead_groups: float = 0.9
    """Alarm when at least this fraction of a step's groups have one reward for all their
    episodes without all succeeding (no learning signal left)."""
    entropy_drop: float = 0.1
    """Alarm when the policy's token entropy falls below this fraction of its warm-up mean while
    rollout success is below health.solved_success (a solved task may well become certain)."""
    solved_success: float = 0.9
    """Rollout success at which low entropy is the expected end of learning, not a collapse."""
    reply_repeat: float = 0.9
    """Alarm when two turns with different inputs get the identical reply at least this often."""
    input_dependence_drop: float = 0.3
    """Alarm when input dependence falls below this fraction of its peak, once the peak has
    reached health.input_dependence_min_peak."""
    input_dependence_min_peak: float = 0.15
    """Input dependence the run must have reached for its loss to be a collapse."""
    malformed_calls_rise: float = 0.2
    """Alarm when the share of tool calls that are malformed (moving average over steps) rises
    this much above the lowest it had reached: multi-turn tool RL can collapse as malformed calls
    rise, with no warning (verl #6252)."""
    reward_without_tools_rise: float = 0.1
    """Alarm when, on tasks declared to need tools, the mean return (moving average over steps,
    in the env's reward units) has risen this much above the lowest it had reached while at most
    health.reward_without_tools_use of the step's episodes called a tool: high reward "while never
    firing a single tool call" (agentcore-rl-toolkit PR #97) means the reward is reached another way."""
    reward_without_tools_use: float = 0.0
    """Share of the episodes on tasks that need tools that called one, at or below which their
    tool use counts as gone (0: not a single call in the step)."""
    mi_inputs: int = 8
    """Distinct inputs cross-scored per step for health/input_dependence (n contexts, then the n
    replies after each on its KV cache); 0 turns the signal off."""

    def check(self) -> None:
        """One-line ConfigError for what the ranges of agentrl.config.limits do not say."""
        if 0 < self.mi_inputs < MIN_INPUTS:
            raise ConfigError(f"health.mi_inputs={self.mi_inputs} must be 0 (off) or in [{MIN_INPUTS}, 64] "
                              "(each step scores mi_inputs^2 replies)")


@dataclass
class Alarm:
    """One alarm: which signal, at which step, its value and the threshold it crossed."""

    name: str
    step: int
    value: float
    threshold: float
    detail: str

    def line(self) -> str:
        """The one-line warning."""
        return f"agentrl: collapse alarm at step {self.step}: {self.name}: {self.detail}"


# ---------------------------------------------------------------------------- signals
def group_signals(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """health/dead_groups, health/zero_std_groups and health/reward_std_in_group of a step."""
    groups: dict[int, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
    groups = {g: ts for g, ts in groups.items() if len(ts) > 1}  # one episode has no spread
    if not groups:
        return {}
    zero = dead = 0
    stds = []
    for ts in groups.values():
        rewards = [t.total_reward for t in ts]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        stds.append(std)
        if std < 1e-6:
            zero += 1
            dead += not all(t.success for t in ts)
    n = len(groups)
    return {"health/dead_groups": dead / n, "health/zero_std_groups": zero / n,
            "health/reward_std_in_group": sum(stds) / n}


def turns(t: Trajectory) -> list[tuple[Any, tuple[int, ...], int]]:
    """(input key, reply ids, start of the reply) of each turn: the key is the observation the
    turn acted on when the agent recorded it, else the ids before the reply."""
    out = []
    prev = -1
    n = len(t.token_ids)
    for k, end in enumerate(t.reward_positions):
        reply_ids = [i for i in range(prev + 1, min(end, n - 1) + 1) if t.loss_mask[i]] if end > prev else []
        start = reply_ids[0] if reply_ids else prev + 1
        key = (t.tag, t.turn_states[k]) if k < len(t.turn_states) else (t.tag, tuple(t.token_ids[:start]))
        out.append((key, tuple(t.token_ids[i] for i in reply_ids), start))
        prev = max(prev, end)
    return out


def reply_repeat(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """health/reply_repeat: P(same reply ids | two turns with different inputs), from counts."""
    pairs = [(key, reply) for t in trajs for key, reply, _ in turns(t)]
    if len(pairs) < 2:
        return {}

    def same(counts: Counter) -> int:
        return sum(c * (c - 1) // 2 for c in counts.values())

    n = len(pairs)
    all_pairs = n * (n - 1) // 2
    different_inputs = all_pairs - same(Counter(k for k, _ in pairs))
    if different_inputs == 0:
        return {}  # every turn saw the same input: repetition says nothing
    same_reply_different_input = same(Counter(r for _, r in pairs)) - same(Counter(pairs))
    return {"health/reply_repeat": same_reply_different_input / different_inputs,
            "health/distinct_replies": float(len({r for _, r in pairs}))}


def cross_inputs(trajs: Sequence[Trajectory], n: int) -> list[tuple[list[int], list[int]]]:
    """Up to `n` (context ids, reply ids) pairs with distinct inputs and non-empty replies, the
    first of each input in batch order (deterministic)."""
    seen: set = set()
    out = []
    for t in trajs:
        for key, reply, start in turns(t):
            if key in seen or not reply:
                continue
            seen.add(key)
            out.append((list(t.token_ids[:start]), list(reply)))
            if len(out) == n:
                return out
    return out


def _number(metrics: Any, key: str) -> float:
    """`metrics[key]` when it is a finite number, else 0 (an agent's metrics are free-form)."""
    value = metrics.get(key, 0.0) if isinstance(metrics, dict) else 0.0
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def tool_signals(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """health/malformed_calls of a step (left out when it made no tool call), and on the episodes
    declared to need tools, health/tool_use and health/tool_task_reward (left out when none)."""
    calls = malformed = 0.0
    needing: list[tuple[bool, float]] = []
    for t in trajs:
        if t.segment:  # segment 0 stands for its episode (its metrics and return are the episode's)
            continue
        metrics = t.info.get("metrics")
        n = _number(metrics, "tools/calls")
        calls += n
        malformed += _number(metrics, "tools/malformed")
        if t.info.get("needs_tools"):
            needing.append((n > 0, t.total_reward))
    out = {"health/malformed_calls": malformed / calls} if calls else {}
    if needing:
        out["health/tool_use"] = sum(used for used, _ in needing) / len(needing)
        out["health/tool_task_reward"] = sum(r for _, r in needing) / len(needing)
    return out


def input_dependence(loglik: Sequence[Sequence[float]]) -> dict[str, float]:
    """health/input_dependence and health/input_retrieval from `loglik[i][j]` = log p(reply_i |
    input_j) (n x n, n >= 2): the in-batch mutual-information estimate over log n, and how often
    a reply is likeliest under its own input."""
    n = len(loglik)
    assert n >= 2 and all(len(row) == n for row in loglik), "loglik must be n x n with n >= 2"
    mi = hits = 0.0
    for i, row in enumerate(loglik):
        top = max(row)
        log_mean = top + math.log(sum(math.exp(v - top) for v in row) / n)
        mi += row[i] - log_mean
        hits += row[i] >= top
    return {"health/input_dependence": max(0.0, mi / n) / math.log(n), "health/input_retrieval": hits / n}


# ---------------------------------------------------------------------------- alarms
@dataclass
class Monitor:
    """Turns each step's signals into alarms; its state goes into checkpoints (a resumed run
    raises the alarms an uninterrupted one would)."""

    cfg: HealthConfig
    steps_seen: int = 0
    entropy_sum: float = 0.0  # over the warm-up steps: the entropy baseline
    entropy_n: int = 0
    smooth: dict[str, float] = field(default_factory=dict)  # signal -> its moving average over steps
    peak: dict[str, float] = field(default_factory=dict)  # signal -> the highest its moving average has been
    low: dict[str, float] = field(default_factory=dict)  # signal -> the lowest its moving average has been
    streak: dict[str, int] = field(default_factory=dict)
    onset: int | None = None  # first step of the current run of bad steps (any signal)

    def observe(self, step: int, signals: dict[str, float]) -> tuple[dict[str, float], list[Alarm]]:
        """Extra health/ metrics and the alarms that start at this step."""
        c = self.cfg
        self.steps_seen += 1
        warm = self.steps_seen <= c.warmup_steps
        out: dict[str, float] = {}
        bad: dict[str, tuple[float, float, str]] = {}
        entropy = signals.get("health/entropy")
        if entropy is not None and (warm or not self.entropy_n):  # warmup_steps=0: the first step is the base
            self.entropy_sum += entropy
            self.entropy_n += 1
        if entropy is not None and self.entropy_n and self.entropy_sum > 0:
            ratio = entropy / (self.entropy_sum / self.entropy_n)
            out["health/entropy_ratio"] = ratio
            success = signals.get("rollout/success", 0.0)
            if ratio < c.entropy_drop and success < c.solved_success:
                bad["entropy"] = (ratio, c.entropy_drop, f"token entropy fell to {ratio:.3f} of its warm-up mean "
                                  f"(< health.entropy_drop={c.entropy_drop}) with rollout success {success:.2f}")
        dead = signals.get("health/dead_groups")
        if dead is not None and dead >= c.dead_groups:
            bad["dead_groups"] = (dead, c.dead_groups, f"{dead:.0%} of groups got one reward for every episode "
                                  f"without solving the task (>= health.dead_groups={c.dead_groups}): no learning "
                                  "signal left")
        repeat = signals.get("health/reply_repeat")
        if repeat is not None and repeat >= c.reply_repeat:
            bad["reply_repeat"] = (repeat, c.reply_repeat, f"different inputs got the identical reply with "
                                   f"probability {repeat:.2f} (>= health.reply_repeat={c.reply_repeat})")
        mi = signals.get("health/input_dependence")
        if mi is not None:
            avg, peak, _ = self.trend("input_dependence", mi, out)
            if peak is not None and peak >= c.input_dependence_min_peak and avg < c.input_dependence_drop * peak:
                bad["input_dependence"] = (avg, c.input_dependence_drop * peak, f"input dependence fell to {avg:.3f} "
                                           f"from a peak of {peak:.3f} (< health.input_dependence_drop="
                                           f"{c.input_dependence_drop} of it): replies stopped reading the input")
        self._tool_checks(signals, out, bad)
        return out, self._alarms(step, bad, warm)

    def _tool_checks(self, signals: dict[str, float], out: dict[str, float],
                     bad: dict[str, tuple[float, float, str]]) -> None:
        """The tool alarms' checks: malformed calls rising, reward rising without tool calls."""
        c = self.cfg
        malformed = signals.get("health/malformed_calls")
        if malformed is not None:
            avg, _, low = self.trend("malformed_calls", malformed, out)
            if low is not None and avg - low >= c.malformed_calls_rise:
                bad["malformed_calls"] = (avg, low + c.malformed_calls_rise, f"{avg:.0%} of tool calls are malformed "
                                          f"(moving average), up from {low:.0%} (>= health.malformed_calls_rise="
                                          f"{c.malformed_calls_rise} above its lowest): the model is losing the "
                                          "call format")
        reward, use = signals.get("health/tool_task_reward"), signals.get("health/tool_use")
        if reward is not None and use is not None:
            avg, _, low = self.trend("tool_task_reward", reward, out)
            if low is not None and avg - low >= c.reward_without_tools_rise and use <= c.reward_without_tools_use:
                bad["reward_without_tools"] = (
                    avg, low + c.reward_without_tools_rise, f"on tasks that need tools the reward rose to {avg:.3f} "
                    f"(moving average) from {low:.3f} (>= health.reward_without_tools_rise="
                    f"{c.reward_without_tools_rise}) while {use:.0%} of their episodes called a tool (<= "
                    f"health.reward_without_tools_use={c.reward_without_tools_use}): the reward is reached without "
                    "the tools")

    def trend(self, name: str, value: float, out: dict[str, float]) -> tuple[float, float | None, float | None]:
        """Signal `name`'s moving average with this step's value (logged as health/<name>_smooth in
        `out`), and the highest and lowest it had been before (None on its first step). One step's
        value is noisy (a few inputs or calls, sampled replies): alarms compare moving averages."""
        before = self.smooth.get(name)
        avg = value if before is None else SMOOTHING * before + (1 - SMOOTHING) * value
        peak, low = self.peak.get(name), self.low.get(name)
        self.smooth[name] = avg
        self.peak[name] = avg if peak is None else max(peak, avg)
        self.low[name] = avg if low is None else min(low, avg)
        out[f"health/{name}_smooth"] = avg
        return avg, peak, low

    def _alarms(self, step: int, bad: dict[str, tuple[float, float, str]], warm: bool) -> list[Alarm]:
        if warm:
            bad = {}
        self.onset = (self.onset if self.onset is not None else step) if bad else None
        started = []
        for name in ALARMS:
            self.streak[name] = self.streak.get(name, 0) + 1 if name in bad else 0
            if self.streak[name] == self.cfg.patience:
                value, threshold, detail = bad[name]
                started.append(Alarm(name, step, value, threshold, detail))
        return started

    def active(self) -> dict[str, float]:
        """health/alarm_<name>: 1 while the alarm lasts."""
        return {f"health/alarm_{n}": float(self.streak.get(n, 0) >= self.cfg.patience) for n in ALARMS}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps."""
        return {"steps_seen": self.steps_seen, "entropy_sum": self.entropy_sum, "entropy_n": self.entropy_n,
                "smooth": dict(self.smooth), "peak": dict(self.peak), "low": dict(self.low),
                "streak": dict(self.streak), "onset": self.onset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (or an older checkpoint's, which kept input dependence
        alone as mi_ema and mi_peak)."""
        state = dict(state)
        ema, peak = state.pop("mi_ema", None), state.pop("mi_peak", None)
        if ema is not None:
            state.setdefault("smooth", {"input_dependence": ema})
            state.setdefault("peak", {"input_dependence": peak})
            state.setdefault("low", {"input_dependence": ema})  # unknown then; only a rise alarm reads a low
        for key, value in state.items():
            setattr(self, key, dict(value) if isinstance(value, dict) else value)
