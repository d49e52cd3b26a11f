"""Train from Python: a config from a dict, an env class passed directly, seed 003's AgentTrainer.

    python examples/python_api.py                      # fit(cfg, env_cls=ParityEnv)  
    python examples/python_api.py --agent-trainer      # AgentTrainer(...).init_workers(); .fit()
    python examples/python_api.py trainer.total_steps=5 run_dir=runs/parity   # any overrides

No registry and no `imports=`: the class is registered under its own name internally. The agent
is the default chat agent; pass `agent_cls=` to play it with your own.
"""

from __future__ import annotations

import random
import sys

from agentrl import AgentTrainer, fit, load_config


class ParityEnv:
    """Say whether a number is even or odd; one reply per episode."""

    instructions = "Is the number even or odd? Answer as <answer>even</answer> or <answer>odd</answer>."

    async def reset(self, seed=None, options=None):
        self.number = random.Random(seed).randint(0, 99)
        return f"Number: {self.number}", {}

    async def step(self, action: str):
        right = "even" if self.number % 2 == 0 else "odd"
        ok = f"<answer>{right}</answer>" in action
        return ("Correct." if ok else "Wrong."), float(ok), True, False, {"success": ok}

    def sample_action(self, rng: random.Random) -> str:
        return f"<answer>{rng.choice(['even', 'odd'])}</answer>"


def main(args: list[str]) -> dict:
    """Train ParityEnv with `args` as overrides; returns the run's summary."""
    overrides = [a for a in args if a != "--agent-trainer"]
    cfg = load_config({"exp_name": "parity", "env": {"max_turns": 1}, "trainer": {"total_steps": 20}}, overrides)
    if "--agent-trainer" in args:  # seed 003's way
        trainer = AgentTrainer(config=cfg, tokenizer=None, env_cls=ParityEnv)
        trainer.init_workers()
        return trainer.fit()
    return fit(cfg, env_cls=ParityEnv)


if __name__ == "__main__":
    summary = main(sys.argv[1:])
    print(f"eval success {summary['eval_success_before']:.2f} -> {summary['eval_success_after']:.2f}")
