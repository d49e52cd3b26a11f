"""Tools an agent's model can call: plain functions registered with `@tool` (tool.py), the
sandbox for untrusted code (sandbox.py), the built-in `python` tool (python.py) and the
`search` tool over a local corpus (search.py).

`from agentrl.tools import tool, ToolError` is all a tool of your own needs; `agentrl.registry.TOOLS`
holds every registered tool by name (the built-ins once `agentrl.tools.python` and `agentrl.tools.search` are imported).
"""

from agentrl.errors import ToolError, ToolTimeout
from agentrl.tools.tool import Tool, make_tool, tool

__all__ = ["Tool", "ToolError", "ToolTimeout", "make_tool", "tool"]
