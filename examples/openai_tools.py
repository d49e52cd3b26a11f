"""A tool-calling agent written against the `openai` client: `tools=` in, `tool_calls` out.

Train it on the three-digit products with the sandboxed `python` tool (the run offers the tools
of `agent.args.tools`; the warm start demonstrates a call, as for the tool agent):

    agentrl train configs/tool_python.yaml agent.type=openai agent.args.entry=examples/openai_tools:run

The run's session server renders the tools with the model's chat template and hands the model's
`<tool_call>` blocks back as `tool_calls`, as any OpenAI-compatible server does. `call_tool` runs
each call with the tool agent's own code (the same functions, the bubblewrap sandbox, the same
error answers) and counts it in the episode's `tools/` metrics.
"""

from __future__ import annotations

from agentrl.tools import call_tool, offered_tools

MODEL = "gpt-4o-mini"  # a session accepts any model name
MAX_TOOL_CALLS = 1  # then the reply that answers


async def run(client, env, task) -> float | None:
    """Play one episode: calls answered with `tool` messages, replies without one stepped on."""
    schemas = [t.schema for t in offered_tools().values()]
    obs, _ = await env.reset(seed=task.env_seed)
    messages = [{"role": "user", "content": f"{env.instructions}\n{obs}"}]
    calls = 0
    for _ in range(8):
        response = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=256,
                                                        **({"tools": schemas} if schemas else {}))
        choice = response.choices[0]
        message = choice.message
        if message.tool_calls and calls < MAX_TOOL_CALLS:
            calls += len(message.tool_calls)
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                answer = await call_tool(call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})
            continue
        # A reply cut off at max_tokens is no answer (as the built-in agents treat it).
        reply = (message.content or "") if choice.finish_reason in ("stop", "tool_calls") else ""
        messages.append({"role": "assistant", "content": reply})
        obs, _, terminated, truncated, _ = await env.step(reply)
        if terminated or truncated:
            break
        messages.append({"role": "user", "content": obs})
    return None
