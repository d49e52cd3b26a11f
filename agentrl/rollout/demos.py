"""Demonstrations of the env's reply format, played through the real agent and conversation.

A `ScriptedClient` stands in for the engine and answers every prompt with a well-formed reply
carrying a uniformly random valid action (`env.sample_action`). Running the ordinary agent with
it yields trajectories in exactly the token layout training uses, for the warm start.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterator

from agentrl.llm.engine import Completion, SamplingParams


class ScriptedClient:
    """An LLM client whose replies are random valid actions, tokenized and closed with EOS."""

    def __init__(self, tokenizer, sample_action: Callable[[random.Random], str]) -> None:
        self.tokenizer = tokenizer
        self.sample_action = sample_action

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """Answer with a random valid action (seeded by the request)."""
        rng = random.Random(sampling.seed)
        ids = self.tokenizer.encode(self.sample_action(rng), add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        return Completion(ids, [0.0] * len(ids), "stop")


def reply_entropy(sample_action: Callable[[random.Random], str], n: int = 2000, seed: int = 0) -> float:
    """Entropy (nats) of the demonstration reply distribution, estimated from `n` samples."""
    rng = random.Random(seed)
    counts = Counter(sample_action(rng) for _ in range(n))
    return -sum(c / n * math.log(c / n) for c in counts.values())


def corpus(env_factory: Callable, n_episodes: int = 200, max_turns: int = 8, seed: int = 0) -> Iterator[str]:
    """Text the env produces under random play (instructions, observations, replies)."""
    import asyncio

    async def play(k: int) -> list[str]:
        env = env_factory()
        rng = random.Random(seed * 7919 + k)
        try:
            obs, _ = await env.reset(seed=seed * 7919 + k)
            lines = [f"user\n{env.instructions}\n{obs}", "assistant"]
            for _ in range(max_turns):
                action = env.sample_action(rng)
                lines.append(action)
                obs, _, term, trunc, _ = await env.step(action)
                lines.append(f"user\n{obs}")
                if term or trunc:
                    break
            return lines
        finally:
            env.close()

    async def play_all() -> list[list[str]]:
        return await asyncio.gather(*(play(k) for k in range(n_episodes)))

    for lines in asyncio.run(play_all()):
        yield from lines
