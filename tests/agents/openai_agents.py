"""Agent functions for tests/agents/test_openai_agent.py, loaded by path as `agent.args.entry`."""

import httpx

RETURNED: dict[int, list[list[int]]] = {}  # env seed -> the token ids each call returned


async def recording(client, env, task):
    """FrozenLake as examples/openai_frozen_lake.py plays it, keeping what each call returned."""
    obs, _ = await env.reset(seed=task.env_seed)
    messages = [{"role": "user", "content": f"{env.instructions}\n{obs}"}]
    RETURNED[task.env_seed] = []
    for _ in range(8):
        r = await client.chat.completions.create(model="agentrl", messages=messages, max_tokens=8)
        RETURNED[task.env_seed].append(r.choices[0].token_ids)
        reply = r.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        obs, _, terminated, truncated, _ = await env.step(reply if r.choices[0].finish_reason == "stop" else "")
        if terminated or truncated:
            break
        messages.append({"role": "user", "content": obs})


async def amnesiac(client, env, task):
    """Sends only the latest observation each call: every call after the first is a new segment."""
    obs, _ = await env.reset(seed=task.env_seed)
    for _ in range(3):
        r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": obs}])
        obs, _, terminated, truncated, _ = await env.step(r.choices[0].message.content or "")
        if terminated or truncated:
            break


async def scores_itself(client, env, task):
    """One call, then the agent's own reward: returned (seed 0) or posted to the session (seed 1)."""
    obs, _ = await env.reset(seed=task.env_seed)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": obs}])
    await env.step("Left")
    if task.env_seed % 2 == 0:
        return 2.5
    async with httpx.AsyncClient() as http:
        base = str(client.base_url).rstrip("/").removesuffix("/v1")
        r = await http.post(f"{base}/reward", json={"reward": -1.5}, headers={"Authorization": f"Bearer {client.api_key}"})
        r.raise_for_status()
    return None


async def returns_text(client, env, task):
    await env.reset(seed=task.env_seed)
    return "1.0"


def not_async(client, env, task):
    return None


async def two_args(client, env):
    return None
