"""Tools an agent's model can call: plain functions registered with `@tool` (tool.py), the
sandbox for untrusted code (sandbox.py), the built-in `python` tool (python.py) and the
`search` tool over a local corpus (search.py).

`from agentrl.tools import tool, ToolError` is all a tool of your own needs; `agentrl.registry.TOOLS`
holds every registered tool by name (the built-ins once `agentrl.tools.python` and `agentrl.tools.search` are imported).
Agent code written against the `openai` client reaches the run's tools with `offered_tools()` (their
schemas, for `tools=`) and `call_tool(name, arguments)` (a `tool_call` run as the tool agent runs it).
"""

from agentrl.errors import ToolError, ToolTimeout
from agentrl.tools.tool import Tool, call_tool, make_tool, offered_tools, tool

__all__ = ["Tool", "ToolError", "ToolTimeout", "call_tool", "make_tool", "offered_tools", "tool"]
