"""Demonstrations of the env's reply format, played through the real agent and conversation.

A `ScriptedClient` stands in for the engine and answers every prompt with a well-formed reply
carrying a uniformly random valid action in the episode's current state (`env.sample_action`).
Running the ordinary agent with it yields trajectories in exactly the token layout training
uses, for the warm start.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Iterator
from typing import Any

from agentrl.llm.engine import Completion, SamplingParams, episode_key
from agentrl.rollout.collector import CollectResult, GuardedEnv, check_failed, guarded
from agentrl.rollout.loop_thread import LoopThread
from agentrl.tokenizer import Tokenizer


class ScriptedClient:
    """An LLM client whose replies are random valid actions of the episode's own env.

    Pass `client.env_factory` to the collector: it records which env each episode (asyncio task)
    plays, so a reply can be drawn from that env's current state (`env.sample_action`).
    `reply_entropy` sums the entropy of every reply drawn since the last `reset_entropy()`.
    """

    def __init__(self, tokenizer: Tokenizer, make_env: Callable[[], Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self._make_env = make_env
        self._envs: dict[asyncio.Task, Any] = {}
        self.reply_entropy = 0.0

    def env_factory(self) -> Any:
        """A fresh env, remembered as the one the calling episode plays."""
        return self.wrap(self._make_env)()

    def wrap(self, make_env: Callable[[], Any]) -> Callable[[], Any]:
        """An env factory like `make_env` whose envs this client answers for (one per tag)."""
        def factory() -> Any:
            env = make_env()
            self._envs[asyncio.current_task()] = env
            return env

        return factory

    def reset_entropy(self) -> None:
        """Start a new entropy sum (and forget finished episodes)."""
        self.reply_entropy = 0.0
        self._envs = {t: e for t, e in self._envs.items() if not t.done()}

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """Answer with a random valid action of the episode's env (seeded by the request)."""
        env = self._envs[episode_key()]  # the episode's task (sessions generate from another one)
        reply = env.sample_action(random.Random(sampling.seed))
        self.reply_entropy += state_entropy(env.sample_action)
        ids = self.tokenizer.encode(reply, add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        return Completion(ids, [0.0] * len(ids), "stop")


def state_entropy(sample_action: Callable[[random.Random], str], n: int = 64) -> float:
    """log(number of distinct replies) `sample_action` gives in this state: the entropy of a
    uniform choice among them (n draws miss one of four with probability 4 * 0.75**64 < 1e-7)."""
    return math.log(len({sample_action(random.Random(k)) for k in range(n)}))


def corpus(env_factory: Callable, n_episodes: int = 200, max_turns: int = 8, seed: int = 0,
           step: bool = True, timeout: float | None = None, max_failed_fraction: float = 0.5,
           name: str = "env") -> Iterator[str]:
    """Text the env produces under random play (instructions, observations, replies).

    `step=False` reads only first observations and sampled replies, for envs whose `step`
    does not take a reply string (the seeds' `step((qid, answers))`); there a first observation
    that is not text (None: the question comes from a dataset) and a missing `sample_action`
    are skipped, and `close` is optional. An env without `sample_action` gives its first
    observations only.

    The episodes are guarded as a run's (rollout/collector.py): each under `timeout` seconds, in a
    watched event loop; one that raises (SystemExit included), breaks the env contract or times
    out is left out, and more than `max_failed_fraction` of them failing is a RolloutError.
    """
    async def play(k: int) -> list[str]:
        env = env_factory()
        guarded = GuardedEnv(env, per_answer=not step)
        rng = random.Random(seed * 7919 + k)
        try:
            obs, _ = await guarded.reset(seed=seed * 7919 + k)
            if not step:
                lines = [f"user\n{getattr(env, 'instructions', '')}\n{obs}"] if isinstance(obs, str) else []
                sample = getattr(env, "sample_action", None)
                return lines + (["assistant", sample(rng)] if callable(sample) else [])
            lines = [f"user\n{getattr(env, 'instructions', '')}\n{obs}", "assistant"]
            if not callable(getattr(env, "sample_action", None)):  # optional: no random play, first observations only
                return lines
            for _ in range(max_turns):
                action = env.sample_action(rng)
                lines.append(action)
                obs, _, term, trunc, _ = await guarded.step(action)
                lines.append(f"user\n{obs}")
                if term or trunc:
                    break
            return lines
        finally:
            close = getattr(env, "close", None)
            if callable(close):
                close()

    async def play_all() -> list[tuple[list[str] | None, tuple[str, str] | None]]:
        return await asyncio.gather(*(guarded(play(k), timeout) for k in range(n_episodes)))

    played = LoopThread(timeout, f"{n_episodes} episodes of random play have been running").run(play_all)
    errors = [f"{kind}: {message} (episode {k})" for k, (_, failure) in enumerate(played) if failure
              for kind, message in [failure]]
    check_failed(CollectResult([], errors, failed_episodes=len(errors), episodes=n_episodes), max_failed_fraction,
                 f"{name}: random play for the tokenizer's corpus")
    for lines, _ in played:
        yield from lines or []
