"""An MCP server of one tool, `multiply`, built with the official `mcp` SDK (pip install 'agentrl[mcp]').

Any MCP server's tools can be offered to the model (docs/tools.md, "Tools from MCP servers"); this
one, started by the run over stdio, in the bubblewrap sandbox (no network):

    agentrl train configs/tool_python.yaml agent.args.tools=[] \
        'agent.args.mcp_servers=[{command: [.venv/bin/python, examples/mcp_server.py], sandbox: true}]'
"""

from mcp.server.mcpserver import MCPServer

app = MCPServer("calculator", log_level="WARNING")


@app.tool()
def multiply(a: int, b: int) -> str:
    """Multiply two integers."""
    return str(a * b)


if __name__ == "__main__":
    app.run()  # stdio: the run talks to it over stdin and stdout
