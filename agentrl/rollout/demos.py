"""Demonstrations of the env's reply format, played through the real agent and conversation.

A `ScriptedClient` stands in for the engine and answers every prompt with a well-formed reply
carrying a uniformly random valid action in the episode's current state (`env.sample_action`).
Running the ordinary agent with it yields trajectories in exactly the token layout training
uses, for the warm start.

An env may demonstrate better than at random: `env.demonstration(rng, tools)` gives the replies
of one env step, knowing the tools the agent offers (`tools`, empty for an agent without any): a
scripted expert's action (MiniGrid's BabyAI bot), or, for a task that needs tools, tool calls, each
a dict `{"name": ..., "arguments": {...}}` that the client writes in the model's own format (a
`<tool_call>` block, `llm/tool_calls.py`), then the action (a string). The client answers the
episode's next prompts with them in order: the tool agent runs each call and answers it with
the tool's real output before the next reply, so a demonstration holds the call, the tool's
answer and the action that uses it. An env without `demonstration` answers with `sample_action`
alone. A demonstration makes at most the agent's `max_tool_calls`.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from agentrl.llm.engine import Completion, SamplingParams, episode_key
from agentrl.llm.tool_calls import call_text
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
        self._envs: dict[asyncio.Task, tuple[Any, tuple[str, ...]]] = {}  # episode -> (env, tools offered)
        self._queued: dict[asyncio.Task, list[str]] = {}  # episode -> the rest of its step's demonstration
        self.reply_entropy = 0.0

    def env_factory(self) -> Any:
        """A fresh env, remembered as the one the calling episode plays."""
        if self._make_env is None:  # the TypeError calling None gave, with its cause named
            raise TypeError("ScriptedClient.env_factory: no make_env given; pass one to ScriptedClient() "
                            "or build factories with wrap(make_env)")
        return self.wrap(self._make_env)()

    def wrap(self, make_env: Callable[[], Any], tools: Sequence[str] = ()) -> Callable[[], Any]:
        """An env factory like `make_env` whose envs this client answers for (one per tag);
        `tools`: the tools the tag's agent offers, which demonstrations may call."""
        def factory() -> Any:
            env = make_env()
            key = asyncio.current_task()
            assert key is not None  # the collector makes each episode's env inside the episode's task
            self._envs[key] = (env, tuple(tools))
            self._queued.pop(key, None)  # a retried episode starts its demonstration again
            return env

        return factory

    def reset_entropy(self) -> None:
        """Start a new entropy sum (and forget finished episodes)."""
        self.reply_entropy = 0.0
        self._envs = {t: e for t, e in self._envs.items() if not t.done()}
        self._queued = {t: q for t, q in self._queued.items() if not t.done()}

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """Answer with the next reply of the env's demonstration (a random valid action, after the
        tool calls the env demonstrates), seeded by the request."""
        # The episode's task (sessions generate from another one, with EPISODE set to the episode's
        # task by agents/openai.py); episode_key types it as object for other engines' sake.
        key = cast("asyncio.Task[Any]", episode_key())
        env, tools = self._envs[key]
        queued = self._queued.get(key)
        if queued:
            reply = queued.pop(0)
        else:
            replies = demonstration(env, random.Random(sampling.seed), tools)
            reply, self._queued[key] = replies[0], replies[1:]
            # The entropy of the whole step's choice, counted once at its first reply.
            self.reply_entropy += state_entropy(lambda rng: "\n".join(demonstration(env, rng, tools)))
        ids = self.tokenizer.encode(reply, add_special_tokens=False)
        eos = self.tokenizer.eos_token_id
        assert eos is not None  # every agent stops a reply on eos: a tokenizer agentrl runs has one
        ids.append(eos)
        return Completion(ids, [0.0] * len(ids), "stop")


def demonstration(env: Any, rng: random.Random, tools: Sequence[str]) -> list[str]:
    """The replies of one env step of a demonstration: `env.demonstration(rng, tools)` (tool
    calls written as the model writes them, then the action) where the env has it, else
    `[env.sample_action(rng)]`."""
    demo = getattr(env, "demonstration", None)
    steps = list(demo(rng, tuple(tools))) if callable(demo) else [env.sample_action(rng)]
    replies = [call_text(s["name"], s.get("arguments", {})) if isinstance(s, dict) and isinstance(s.get("name"), str)
               else s for s in steps]
    if not replies or not all(isinstance(r, str) for r in replies) or not isinstance(steps[-1], str):
        raise TypeError(f"{type(env).__name__}.demonstration returned {steps!r}; expected a list of tool calls "
                        '({"name": ..., "arguments": {...}}) ending with the action (a string)')
    return replies


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
