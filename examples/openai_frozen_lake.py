"""A FrozenLake agent written only against the `openai` client: no agentrl import.

Train it (the run hands `run` a client whose base_url is a session of its own server):

    agentrl train configs/frozen_lake.yaml agent.type=openai agent.args.entry=examples/openai_frozen_lake:run

Or point it at any OpenAI-compatible server, e.g. `agentrl serve configs/frozen_lake.yaml`:

    python examples/openai_frozen_lake.py http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import asyncio
import sys

MODEL = "gpt-4o-mini"  # agents often hard-code a model name: a session accepts any


async def run(client, env, task) -> float | None:
    """Play one episode: the board in, a move out, until the env ends it (None: the env's rewards)."""
    obs, _ = await env.reset(seed=task.env_seed)
    messages = [{"role": "user", "content": f"{env.instructions}\n{obs}"}]
    for _ in range(8):
        response = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
        choice = response.choices[0]
        reply = choice.message.content or ""
        messages.append({"role": "assistant", "content": reply})
        # A reply cut off at max_tokens is no answer (as the built-in chat agent treats it).
        action = reply if choice.finish_reason == "stop" else ""
        obs, _, terminated, truncated, _ = await env.step(action)
        if terminated or truncated:
            break
        messages.append({"role": "user", "content": obs})
    return None


async def _main(base_url: str) -> None:
    import openai

    from agentrl.envs.frozen_lake import FrozenLakeEnv

    class _Task:
        env_seed = 0

    client = openai.AsyncOpenAI(base_url=base_url, api_key="none")
    env = FrozenLakeEnv(map_name="4x4", is_slippery=False, max_steps=8)

    class _Printing:
        instructions = env.instructions

        async def reset(self, **kw):
            obs, info = await env.reset(**kw)
            print(obs)
            return obs, info

        async def step(self, action):
            print(f"> {action!r}")
            out = await env.step(action)
            print(out[0], out[1])
            return out

    await run(client, _Printing(), _Task())


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1"))
