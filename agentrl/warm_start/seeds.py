"""What the embedded default model needs to serve seed-style (AReaL legacy) agents.

- A tokenizer folder (models/embedded.py: `tokenizer_folder`): seed agents load their own
  tokenizer from `tokenizer_path` (seed 001 passes `tokenizer_path=self.actor.path`).
- Text for the tokenizer: the questions and answers of a seed tag's dataset.
- Warm-start demonstrations: the warm start answers each turn with the env's `sample_action`.
  A seed env without one, whose tag has a dataset, demonstrates with a random answer of that
  dataset as the reply (as `MathEnv.sample_action` does with a file's rows); a tag with neither
  gets no demonstrations (and when no tag has any, the warm start is skipped), said in the log.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from agentrl.runtime.assembly.plan_types import RunPlan

MAX_CORPUS_ROWS = 2000  # dataset rows read into the tiny tokenizer's corpus per tag


def seed_texts(run_plan: RunPlan) -> list[str]:
    """Questions and answers of the seed tags' datasets, as corpus lines."""
    out = []
    for tag in run_plan.tags:
        if tag.rows is not None:
            for row in tag.rows[:MAX_CORPUS_ROWS]:
                out += [f"user\n{row.question}", "assistant"] + ([row.answer] if row.answer else [])
    return out


class _Demonstrating:
    """A seed env with a `sample_action` drawn from its dataset's answers (warm start only)."""

    def __init__(self, env: Any, answers: list[str]) -> None:
        self._env, self._answers = env, answers

    def sample_action(self, rng: random.Random) -> str:
        return rng.choice(self._answers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def _demonstrating(make_env: Callable[[], Any], answers: list[str]) -> Callable[[], Any]:
    """An env factory whose envs demonstrate with a random one of `answers`."""
    return lambda: _Demonstrating(make_env(), answers)


def demo_factories(run_plan: RunPlan, log: Callable[[str], None]) -> dict[str, Callable[[], Any]]:
    """The tags that can be demonstrated in the warm start, with env factories whose envs all
    have `sample_action`; the others are named in the log."""
    out: dict[str, Callable[[], Any]] = {}
    for tag, make_env in run_plan.factories.items():
        env = make_env()
        has_sample = callable(getattr(env, "sample_action", None))
        close = getattr(env, "close", None)
        if callable(close):
            close()
        if has_sample:
            out[tag] = make_env
            continue
        answers = sorted({r.answer for r in run_plan.tag(tag).rows or () if r.answer})
        if answers:
            log(f"warm start: tag {tag}: the env has no sample_action; replies are random answers of its dataset")
            out[tag] = _demonstrating(make_env, answers)
        else:
            log(f"warm start: tag {tag} is not demonstrated (its env has no sample_action and no dataset answers)")
    return out
