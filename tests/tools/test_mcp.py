"""Tools from MCP servers (agentrl/tools/mcp.py), against real servers built with the `mcp` SDK over
stdio and streamable HTTP: listed with their schemas rendered as ours, called under the tool
timeout with errors answered as ours, huge answers cut, special-token text kept as text, a server
that dies restarted once and then its episodes failed, bad schemas and names refused in one line,
and no server process left once the servers are closed."""

import asyncio
import re
import sys

import psutil
import pytest
from helpers import ScriptedReplies
from mcp_servers import FORGED, serve_http, stdio_entry, write_server

from agentrl.agents.tool import ToolAgent
from agentrl.errors import ConfigError, ToolError
from agentrl.llm.engine import SamplingParams
from agentrl.tools.mcp import MAX_ANSWER_CHARS, McpServerDown, close_servers, mcp_tools, parse_servers
from agentrl.tools.tool import ToolUsage, answer_call
from agentrl.trajectory import Task


class OneStep:
    """An env of one step: answer 7."""

    instructions = "Answer with <answer>N</answer>."

    async def reset(self, seed=None, options=None):
        return "What is N?", {}

    async def step(self, action):
        return "done", float("7" in action), True, False, {"success": "7" in action}

    def close(self):
        pass


def _call(name, **arguments):
    import json

    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def _episode(tok, entry, replies, **agent_args):
    llm = ScriptedReplies(tok, replies)
    agent = ToolAgent(tok, SamplingParams(max_new_tokens=64), max_turns=1, mcp_servers=[entry], **agent_args)
    traj = asyncio.run(agent.run_episode(Task(env_seed=0, group_id=0, sampling_seed=1), OneStep(), llm))
    return traj, llm


def _answers(tok, traj):
    return re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", tok.decode(traj.token_ids), re.S)


@pytest.fixture(scope="module")
def server_file(tmp_path_factory):
    return write_server(tmp_path_factory.mktemp("mcp"))


@pytest.fixture(scope="module")
def tools(server_file):
    """The tools of one stdio server, shared by the module's tests; stopped after."""
    specs = parse_servers([stdio_entry(server_file, name="calc")])
    yield mcp_tools(specs, {})
    close_servers(specs)


def test_tools_are_listed_with_their_schemas_rendered_as_ours(tools):
    assert {"add", "slow", "crash", "huge", "fail", "pid", "forged"} <= set(tools)
    fn = tools["add"].schema["function"]
    assert tools["add"].schema["type"] == "function" and fn["name"] == "add"
    assert fn["description"] == "Add two integers."
    assert fn["parameters"]["type"] == "object" and fn["parameters"]["required"] == ["a", "b"]
    assert fn["parameters"]["properties"]["a"]["type"] == "integer"
    assert not tools["add"].settings  # nothing of the run's is hidden from the model


def test_calls_answer_and_errors_are_answered_and_counted_as_ours(tools):
    usage = ToolUsage()

    async def calls():
        return [await answer_call(tools, "add", {"a": 2, "b": 3}, 5.0, usage),
                await answer_call(tools, "add", '{"a": 2, "b": 40}', 5.0, usage),  # an OpenAI client's JSON string
                await answer_call(tools, "add", {"a": "two", "b": 3}, 5.0, usage),  # checked against the schema
                await answer_call(tools, "fail", {}, 5.0, usage)]

    assert asyncio.run(calls()) == ["5", "42", "Error: argument 'a' of add must be of type integer, got string",
                                    "Error: Error executing tool fail"]
    assert (usage.malformed, usage.errors, usage.timeouts) == (1, 1, 0)


def test_a_slow_call_times_out_and_the_server_answers_the_next(tools):
    usage = ToolUsage()

    async def calls():
        return [await answer_call(tools, "slow", {"seconds": 600}, 0.2, usage),
                await answer_call(tools, "add", {"a": 1, "b": 1}, 5.0, usage)]

    assert asyncio.run(calls()) == ["Error: slow did not answer within 0.2 s and was stopped", "2"]
    assert (usage.errors, usage.timeouts) == (1, 1)


def test_a_huge_answer_is_cut_as_ours_and_bounded_in_the_client(tools, tiny_tokenizer, server_file):
    assert len(asyncio.run(tools["huge"].run({"n": 1_000_000}, 30.0))) == MAX_ANSWER_CHARS + len("...(truncated)")
    traj, _ = _episode(tiny_tokenizer, stdio_entry(server_file, name="calc"),
                       [_call("huge", n=100_000), "<answer>7</answer>"], max_tool_response_length=20)
    assert _answers(tiny_tokenizer, traj) == ["x" * 20 + "...(truncated)"]  # the tool agent's bound, verl's mark
    assert traj.success and traj.info["metrics"]["tools/calls"] == 1.0


def test_special_token_text_in_an_answer_stays_text(tools, tiny_tokenizer, server_file):
    tok = tiny_tokenizer
    traj, llm = _episode(tok, stdio_entry(server_file, name="calc"), [_call("forged"), "<answer>7</answer>"])
    (a, b, _, name), = [s for s in traj.info["tool_spans"] if s[2] == "answer"]
    answer = traj.token_ids[a:b]
    start, end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    assert answer.count(start) == 1 and answer.count(end) == 1  # the tool turn's own markers only
    assert tok.decode(answer) == f"<|im_start|>tool\nok\n{FORGED}<|im_end|>\n" and name == "forged"
    # the MCP tools are in the system turn, rendered by the template as ours are
    assert '"name": "forged"' in tok.decode(llm.prompts[0]) and tok.decode(llm.prompts[0]).count("# Tools") == 1


def test_a_dying_server_is_restarted_once_then_its_episodes_fail(server_file, tiny_tokenizer):
    entry = stdio_entry(server_file, name="fragile")
    specs = parse_servers([entry])
    tools = mcp_tools(specs, {})
    try:
        first = int(asyncio.run(tools["pid"].run({}, 30.0)))
        with pytest.raises(ToolError, match="stopped during the call; it was restarted"):
            asyncio.run(tools["crash"].run({}, 30.0))
        second = int(asyncio.run(tools["pid"].run({}, 30.0)))
        assert second != first and not psutil.pid_exists(first)
        # the tool agent answers the first death as a failed call; the second fails the episode
        with pytest.raises(McpServerDown, match="'fragile' is down"):
            _episode(tiny_tokenizer, entry, [_call("crash"), "<answer>7</answer>"])
        with pytest.raises(McpServerDown):  # and every later call to it
            asyncio.run(tools["add"].run({"a": 1, "b": 2}, 30.0))
        assert not psutil.pid_exists(second)
    finally:
        close_servers(specs)


def test_a_bad_schema_and_a_taken_name_are_refused_in_one_line(tools, server_file, tiny_tokenizer):
    calc, two = stdio_entry(server_file, name="calc"), stdio_entry(server_file, name="two")
    try:
        with pytest.raises(ValueError) as bad:
            ToolAgent(tiny_tokenizer, SamplingParams(), max_turns=1,
                      mcp_servers=[stdio_entry(server_file, name="bad", args=["badschema"])])
        assert str(bad.value) == ("MCP server 'bad': tool 'add' has an inputSchema that is not a JSON object schema "
                                  "(inputSchema.type: Input should be 'object'); fix the server or leave it out of "
                                  "agent.args.mcp_servers")
        with pytest.raises(ValueError, match="MCP server 'two': tool 'add' has the name of MCP server 'calc''s tool"):
            ToolAgent(tiny_tokenizer, SamplingParams(), max_turns=1, mcp_servers=[calc, two])
        with pytest.raises(ConfigError, match="MCP server 'calc': tool 'add' has the name of our tool 'add'"):
            mcp_tools(parse_servers([calc]), {"add": tools["pid"]})  # a tool of ours named add
        # the servers a refusal started are stopped (`two` too); the one started before runs on
        left = [p.pid for p in psutil.Process().children() if str(server_file) in p.cmdline()]
        assert left == [int(asyncio.run(tools["pid"].run({}, 30.0)))]
    finally:
        close_servers(parse_servers([two]))


@pytest.mark.parametrize(("entry", "expected"), [
    ({"command": "python server.py"}, "mcp_servers[0].command='python server.py' must be a non-empty list of strings"),
    ({"command": ["python", 3]}, "mcp_servers[0].command=['python', 3] must be a non-empty list of strings"),
    ({"url": "ftp://host/mcp"}, "mcp_servers[0].url='ftp://host/mcp' must be an http:// or https:// url"),
    ({"url": "http://h/mcp", "sandbox": True}, "mcp_servers[0].sandbox applies to a stdio server"),
    ({"command": ["x"], "args": []}, "mcp_servers[0].args is not a key of an MCP server; the keys: command, env"),
    ({"command": ["x"], "env": {"A": 1}}, "mcp_servers[0].env={'A': 1} must be a mapping of strings to strings"),
    ({"command": ["x"], "sandbox": "yes"}, "mcp_servers[0].sandbox='yes' must be true or false"),
    ({}, "mcp_servers[0] needs exactly one of `command` (a stdio server) or `url`"),
])
def test_bad_entries_are_refused_in_one_line(entry, expected):
    with pytest.raises(ConfigError) as e:
        parse_servers([entry])
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_the_plan_refuses_a_bad_entry_in_one_line_and_starts_no_server(capfd, monkeypatch, server_file, tmp_path):
    from agentrl.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["plan", "env.type=math", "agent.type=tool", "agent.args.mcp_servers=[{url: ftp://h/mcp}]"]) == 2
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "agent.args.mcp_servers=" in lines[0]
    assert "must be an http:// or https:// url" in lines[0]
    pids = tmp_path / "pids"  # the server writes its pid here when it starts
    entry = f"[{{command: [{sys.executable}, {server_file}], env: {{PID_FILE: {pids}}}}}]"
    assert main(["plan", "env.type=math", "agent.type=tool", f"agent.args.mcp_servers={entry}"]) == 0
    assert "mcp_servers" in capfd.readouterr().out and not pids.exists()


def test_a_streamable_http_server(server_file):
    proc, url = serve_http(server_file)
    try:
        specs = parse_servers([{"url": url, "name": "web"}])
        tools = mcp_tools(specs, {})
        assert asyncio.run(tools["add"].run({"a": 20, "b": 22}, 30.0)) == "42"
        assert asyncio.run(tools["pid"].run({}, 30.0)) == str(proc.pid)  # that server answered
    finally:
        close_servers(specs)
        proc.kill()
        proc.wait()


def test_a_sandboxed_server_has_no_network_and_no_process_is_left(server_file):
    specs = parse_servers([stdio_entry(server_file, name="boxed", sandbox=True)])
    tools = mcp_tools(specs, {})
    try:
        assert asyncio.run(tools["interfaces"].run({}, 30.0)) == "lo"  # the sandbox's own, down loopback only
        assert asyncio.run(tools["add"].run({"a": 1, "b": 2}, 30.0)) == "3"
        boxed = [p for p in psutil.Process().children(recursive=True) if p.name() == "bwrap"]
        tree = boxed + [c for b in boxed for c in b.children(recursive=True)]
        assert boxed and any("python" in p.name() for p in tree)  # the server runs inside bubblewrap
    finally:
        close_servers(specs)
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_an_openai_client_agent_offers_and_calls_them_as_its_tools(tools, server_file, tiny_tokenizer):
    from agentrl.agents.openai import OpenAIAgent
    from agentrl.tools import call_tool, offered_tools
    from agentrl.tools.tool import EPISODE_TOOLS, EpisodeTools

    agent = OpenAIAgent(tiny_tokenizer, SamplingParams(), max_turns=1, entry="examples/openai_tools:run",
                        mcp_servers=[stdio_entry(server_file, name="calc")])
    assert {"add", "forged"} <= set(agent.tools)  # what offered_tools() hands the user's function
    episode = EpisodeTools(agent.tools, agent.tool_timeout, agent.max_tool_calls)

    async def play():
        token = EPISODE_TOOLS.set(episode)
        try:
            schemas = [t.schema for t in offered_tools().values()]
            return schemas, await call_tool("add", '{"a": 4, "b": 5}'), await call_tool("fail", "{}")
        finally:
            EPISODE_TOOLS.reset(token)

    schemas, answer, failed = asyncio.run(play())
    assert tools["add"].schema in schemas and answer == "9" and failed == "Error: Error executing tool fail"
    assert (episode.usage.calls, episode.usage.errors) == (2, 1)


def test_an_answer_is_its_text_blocks_or_its_structured_content():
    from mcp.types import CallToolResult, ImageContent, TextContent

    from agentrl.tools.mcp import answer_text

    image = ImageContent(type="image", data="AA==", mime_type="image/png")
    assert answer_text(CallToolResult(content=[TextContent(type="text", text="a"), image])) == "a\n[image content]"
    assert answer_text(CallToolResult(content=[], structured_content={"n": 1})) == '{"n": 1}'
