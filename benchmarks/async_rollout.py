"""Asynchronous rollout against lockstep rollout, on a multi-turn workload with tool-like latency.

Every episode talks to an env whose replies take a long-tailed time (mostly tens of
milliseconds, now and then seconds, as a tool call or a remote sandbox does) and whose length
varies (2 to 8 turns). Per training step (real rollouts with the tiny model through the local
engine, then a real PPO update) we time:

  (a) lockstep   all episodes advance turn by turn together: one batched generate per turn,
                 then every env step, waiting for the slowest (the verl-style seed's
                 SyncMultiTurnRollout);
  (b) k=0        our collector, on-policy: each episode runs at its own pace;
  (c) k=1, k=2   our collector with asynchronous rollout (rollout.max_staleness=k).

For each we report wall seconds per step, the fraction of that time the engine computes, and
the lower bound max(engine time per step, the step's longest env time). Each episode of a group
draws its own latency plan (a tool call's latency is not a property of the task), and every
mode draws the same plans: the n-th reset of an env seed gets plan n mod group_size, so the
lower bound is exact. `--shared-plans` gives a group's episodes one plan (fewer stragglers for
lockstep to wait on). The last line is a JSON summary:
`speedup_vs_lockstep` = (a) / (b), `ratio_to_lower_bound` = the best (c) / its lower bound.

`--ray` times the Ray runtime instead (runtime.kind=ray: one engine replica, one env manager,
every process on runtime.num_threads=1, the local run too): k=1 locally, k=0 on Ray and k=1 on
Ray; `ray_async_speedup` = Ray k=0 / Ray k=1, `ray_over_local_async` = Ray k=1 / local k=1.

    python benchmarks/async_rollout.py              # full run (a few minutes on 2 CPU cores)
    python benchmarks/async_rollout.py --quick      # a smoke run
    python benchmarks/async_rollout.py --shared-plans   # a group's episodes share one latency plan
    python benchmarks/async_rollout.py --ray        # k=1 on Ray vs k=0 on Ray vs k=1 locally
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

from agentrl.agents.loop import turn_sampling
from agentrl.config import load_config
from agentrl.llm.conversation import Conversation
from agentrl.metrics import read_jsonl
from agentrl.registry import register_env
from agentrl.rollout.collector import CollectResult
from agentrl.rollout.tasks import make_tasks
from agentrl.runtime.assembly.trainer import build_trainer
from agentrl.runtime.local import train
from agentrl.trajectory import Task, Trajectory


class ToolEnv:
    """An env whose step takes a long-tailed time; the episode lasts 2-8 turns, set by its plan."""

    instructions = "Call the tool: answer <answer>call</answer>."
    resets: dict[int, int] = {}  # per env seed; its n-th reset plays plan n mod plans_per_seed

    def __init__(self, short: float = 0.05, long: float = 2.0, long_prob: float = 0.05,
                 plans_per_seed: int = 1) -> None:
        self.short, self.long, self.long_prob = short, long, long_prob
        self.plans_per_seed = plans_per_seed
        self.plan: list[float] = []
        self.turn = 0

    def latencies(self, seed: int, k: int = 0) -> list[float]:
        """The step latencies of plan `k` of env seed `seed`."""
        rng = random.Random(seed * 64 + k)
        n = rng.randint(2, 8)
        return [self.long * (0.5 + rng.random()) if rng.random() < self.long_prob
                else self.short * (0.2 + 1.6 * rng.random()) for _ in range(n)]

    async def reset(self, seed=None, options=None):
        seed = seed or 0
        n = ToolEnv.resets.get(seed, 0)
        ToolEnv.resets[seed] = n + 1
        self.plan, self.turn = self.latencies(seed, n % self.plans_per_seed), 0
        return f"Tool ready. {len(self.plan)} calls to make.", {}

    async def step(self, action: str):
        await asyncio.sleep(self.plan[self.turn])
        self.turn += 1
        done = self.turn >= len(self.plan)
        reward = float("call" in action)
        return f"Result {self.turn}.", reward, done, False, {"success": True} if done else {}

    def sample_action(self, rng: random.Random) -> str:
        return "<answer>call</answer>"

    def close(self) -> None:
        pass


register_env("tool_latency", ToolEnv, overwrite=True)


class LockstepCollector:
    """All episodes of a step advance turn by turn together (the seed's SyncMultiTurnRollout)."""

    def __init__(self, collector) -> None:
        (spec,) = collector.tags.values()  # the benchmark runs one env
        self.env_factory, self.agent, self.llm = spec.env_factory, spec.agent, collector.llm

    def collect(self, tasks: list[Task]) -> CollectResult:
        """Play `tasks` in lockstep."""
        return asyncio.run(self.acollect(tasks))

    async def acollect(self, tasks: list[Task]) -> CollectResult:
        """Async form of `collect`."""
        envs = [self.env_factory() for _ in tasks]
        firsts = await asyncio.gather(*(e.reset(seed=t.env_seed) for e, t in zip(envs, tasks)))
        convs = []
        for env, (obs, _) in zip(envs, firsts):
            conv = Conversation(self.agent.tokenizer)
            conv.add_message("user", f"{env.instructions}\n{obs}")
            convs.append(conv)
        live = list(range(len(tasks)))
        done_info: dict[int, dict] = {}
        for turn in range(self.agent.max_turns):
            comps = await asyncio.gather(*(self.llm.generate(convs[i].prompt_ids(),
                                                             turn_sampling(self.agent.sampling, tasks[i], turn))
                                           for i in live))
            replies = [convs[i].add_completion(c, self.agent.eos_token_ids) for i, c in zip(live, comps)]
            outs = await asyncio.gather(*(envs[i].step(r) for i, r in zip(live, replies)))
            still = []
            for i, (obs, reward, term, trunc, info) in zip(live, outs):
                convs[i].set_turn_reward(reward)
                if term or trunc:
                    done_info[i] = {**info, "terminated": term}
                else:
                    convs[i].add_message("user", obs)
                    still.append(i)
            live = still
            if not live:
                break
        trajs = [Trajectory(c.token_ids, c.loss_mask, c.logprobs, c.versions, c.rewards, c.reward_positions,
                            t.group_id, t.env_seed, success=bool(done_info.get(i, {}).get("success")),
                            terminated=bool(done_info.get(i, {}).get("terminated")), tag=t.tag)
                 for i, (c, t) in enumerate(zip(convs, tasks))]
        return CollectResult(trajs, episodes=len(tasks))


def run_mode(name: str, overrides: list[str], steps: int, workdir: Path, cache: Path) -> dict:
    """Train `steps` steps in one mode; per-step wall, engine and lower-bound seconds."""
    cfg = load_config(None, [*overrides, f"run_dir={workdir / name}", f"model.cache_dir={cache}"])
    ToolEnv.resets.clear()  # every mode draws the same plans
    if cfg.runtime.kind == "ray":  # the env manager imports this file (imports=): its own plan counter, from 0
        train(cfg, log=lambda m: None)
    else:
        trainer = build_trainer(cfg, workdir / name, log=lambda m: None)
        if name == "lockstep":
            trainer.rollout.collector = LockstepCollector(trainer.rollout.collector)
        trainer.fit()
    rows = [r for r in read_jsonl(workdir / name / "metrics.jsonl") if "perf/step_seconds" in r][1:]
    wall = statistics.mean(r["perf/step_seconds"] for r in rows)
    engine = statistics.mean(_engine_seconds(r) for r in rows)
    env = ToolEnv(**cfg.env.args)
    groups = cfg.rollout.batch_size // cfg.rollout.group_size
    longest_env = statistics.mean(
        max(sum(env.latencies(t.env_seed, k)) for t in make_tasks(cfg.seed, r["step"], groups, 1)
            for k in range(env.plans_per_seed))
        for r in rows)
    return {"mode": name, "step_seconds": wall, "engine_seconds": engine, "engine_busy": engine / wall,
            "longest_env_seconds": longest_env, "lower_bound": max(engine, longest_env),
            "update_seconds": statistics.mean(r.get("perf/time_update", 0.0) for r in rows)}


def _engine_seconds(row: dict) -> float:
    if "perf/engine_busy_seconds" in row:
        return row["perf/engine_busy_seconds"]
    rate = row.get("perf/engine_tokens_per_s", 0.0)
    return row.get("perf/engine_generated_tokens", 0.0) / rate if rate else 0.0


def main(argv: list[str] | None = None) -> dict:
    """Run every mode and print the table and the JSON summary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6, help="training steps per mode (the first is not timed)")
    p.add_argument("--quick", action="store_true", help="tiny budget, for a smoke run")
    p.add_argument("--batch-size", type=int, default=32, help="episodes per step (rollout.batch_size)")
    p.add_argument("--group-size", type=int, default=4, help="episodes per env seed (rollout.group_size)")
    p.add_argument("--shared-plans", action="store_true",
                   help="a group's episodes share one latency plan (batch_size / group_size plans per step)")
    p.add_argument("--long-prob", type=float, default=0.05, help="chance that one env step is a long one")
    p.add_argument("--ray", action="store_true", help="k=1 on Ray vs k=0 on Ray vs k=1 locally (runtime.kind=ray)")
    args = p.parse_args(argv)
    steps = 2 if args.quick else args.steps
    base = ["env.type=tool_latency", "env.max_turns=8", f"rollout.batch_size={args.batch_size}",
            f"rollout.group_size={args.group_size}", f"env.args.long_prob={args.long_prob}",
            f"env.args.plans_per_seed={1 if args.shared_plans else args.group_size}",
            "rollout.max_new_tokens=8", f"actor.ppo_mini_batch_size={args.batch_size}", "actor.micro_batch_size=16",
            f"trainer.total_steps={steps}", "trainer.test_freq=0", "trainer.save_freq=0",
            "trainer.eval_episodes=1", "trainer.progress=false", "trainer.logger=[jsonl]",
            "model.warm_start.max_steps=1"]
    if args.quick:  # a smaller tiny model, shorter latencies: the same modes and steps, a smaller budget
        base += ["rollout.batch_size=8", "actor.ppo_mini_batch_size=8", "actor.micro_batch_size=8",
                 "env.args.short=0.01", "env.args.long=0.1", "model.tiny.hidden_size=32",
                 "model.tiny.num_hidden_layers=1", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=300"]
    modes = {"lockstep": [], "k=0": [], "k=1": ["rollout.max_staleness=1"], "k=2": ["rollout.max_staleness=2"]}
    if args.ray:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray = ["runtime.kind=ray", f"imports=[{Path(__file__).resolve()}]"]  # the actors register tool_latency
        # The local run first: a Ray run's import re-registers the env here from the imported module.
        base.append("runtime.num_threads=1")
        modes = {"local k=1": ["rollout.max_staleness=1"], "ray k=0": ray, "ray k=1": [*ray, "rollout.max_staleness=1"]}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, extra in modes.items():
            results.append(run_mode(name, [*base, *extra], steps, work, work / "cache"))
            r = results[-1]
            print(f"{name:9s} step {r['step_seconds']:6.2f} s  engine {r['engine_seconds']:5.2f} s "
                  f"({r['engine_busy']:4.0%} busy)  longest env {r['longest_env_seconds']:5.2f} s  "
                  f"update {r['update_seconds']:5.2f} s  lower bound {r['lower_bound']:5.2f} s", flush=True)
    by = {r["mode"]: r for r in results}
    if args.ray:
        summary = {"ray_async_speedup": by["ray k=0"]["step_seconds"] / by["ray k=1"]["step_seconds"],
                   "ray_over_local_async": by["ray k=1"]["step_seconds"] / by["local k=1"]["step_seconds"],
                   **{f"step_seconds_{r['mode'].replace(' ', '_')}": round(r["step_seconds"], 3) for r in results},
                   **{f"lower_bound_{r['mode'].replace(' ', '_')}": round(r["lower_bound"], 3) for r in results}}
        print(json.dumps(summary))
        return summary
    best = min((by["k=1"], by["k=2"]), key=lambda r: r["step_seconds"])
    summary = {"speedup_vs_lockstep": by["lockstep"]["step_seconds"] / by["k=0"]["step_seconds"],
               "ratio_to_lower_bound": best["step_seconds"] / best["lower_bound"],
               "best_async": best["mode"],
               **{f"step_seconds_{r['mode']}": round(r["step_seconds"], 3) for r in results}}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
