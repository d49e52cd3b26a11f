"""Sessions: an OpenAI client's calls recorded token-exact. 64 concurrent sessions over loopback
keep their ids apart; a call that continues the history extends the previous prompt and reply
id for id; a rewritten history starts a counted segment; tool calls, n > 1 and stop strings."""

import asyncio
import copy
import re
import ssl

import httpx
import openai
import pytest
from helpers import nodelay_client, segments

from agentrl.config.serve import ServeConfig
from agentrl.llm.engine import Completion
from agentrl.llm.local.engine import LocalEngine
from agentrl.llm.server.app import start_server
from agentrl.llm.server.chat_messages import render
from agentrl.llm.server.openai_schema import RequestSampling
from agentrl.llm.server.sessions import RequestPolicy, SessionStore

KEY = "session-key"


@pytest.fixture(scope="module")
def server(tiny_model, tiny_tokenizer):
    engine = LocalEngine(copy.deepcopy(tiny_model), eos_token_ids=(tiny_tokenizer.eos_token_id,),
                         pad_token_id=tiny_tokenizer.pad_token_id, tokenizer=tiny_tokenizer)
    handle = start_server(engine, tiny_tokenizer, ServeConfig(port=0, api_key=KEY, max_tokens=16))
    yield handle
    handle.stop()


SSL = ssl.create_default_context()  # one for all clients: building one per client costs ~10-80 ms


async def _episode(base_url: str, i: int) -> list[list[int]]:
    """Three turns of session `i`, each message marked with `i`; the ids the client was returned."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0,
                                http_client=httpx.AsyncClient(verify=SSL))
    messages = [{"role": "user", "content": f"marker {i}. P _ _ _"}]
    returned = []
    for turn in range(3):
        r = await client.chat.completions.create(model="any-name", messages=messages, max_tokens=4, seed=i)
        returned.append(r.choices[0].token_ids)
        messages += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": f"marker {i}. turn {turn}"}]
    await client.close()
    return returned


def test_64_concurrent_sessions_keep_their_ids_apart(server, tiny_tokenizer):
    h = {"Authorization": f"Bearer {KEY}"}
    http = nodelay_client(base_url=server.url, headers=h)
    opened = [http.post("/sessions").json() for _ in range(64)]

    async def all_sessions():
        return await asyncio.gather(*(_episode(s["base_url"], i) for i, s in enumerate(opened)))
    returned = asyncio.run(all_sessions())
    for i, (s, ids) in enumerate(zip(opened, returned)):
        record = http.get(f"/sessions/{s['id']}").json()
        assert record["turns"] == 3 and record["new_segments"] == 0 and len(record["segments"]) == 1
        seg = record["segments"][0]
        spans = segments(seg["loss_mask"])
        assert [seg["token_ids"][a:b] for a, b in spans] == ids  # exactly what this client was returned
        prompt_text = tiny_tokenizer.decode([t for t, m in zip(seg["token_ids"], seg["loss_mask"]) if not m])
        assert set(re.findall(r"marker (\d+)\.", prompt_text)) == {str(i)}  # no other session's text
        assert http.delete(f"/sessions/{s['id']}").json()["deleted"]


class Scripted:
    """An LLM client that answers with the given texts in order (EOS-terminated unless a
    Completion is given), for unit tests of the session's bookkeeping."""

    def __init__(self, tok, replies):
        self.tok, self.replies = tok, list(replies)

    async def generate(self, prompt_ids, sampling):
        reply = self.replies.pop(0)
        if isinstance(reply, Completion):
            return reply
        ids = self.tok.encode(reply, add_special_tokens=False) + [self.tok.eos_token_id]
        return Completion(ids, [-0.5] * len(ids), "stop")


def _session(tok, replies):
    return SessionStore().open(tok, Scripted(tok, replies), None, RequestPolicy(16, (tok.eos_token_id,)))


ASK = RequestSampling(max_tokens=8)


def test_a_continued_history_extends_the_prompt_and_a_rewrite_starts_a_segment(tiny_tokenizer):
    tok = tiny_tokenizer
    s = _session(tok, ["<answer>Left</answer>", "<answer>Up</answer>", "<answer>Down</answer>"])
    m1 = [{"role": "user", "content": "Move P to G."}]
    r1 = asyncio.run(s.chat(m1, None, ASK))
    assert r1.prompt_ids == tok.apply_chat_template(m1, add_generation_prompt=True, return_dict=False)
    c1 = r1.choices[0].completion.token_ids
    m2 = m1 + [{"role": "assistant", "content": r1.choices[0].content}, {"role": "user", "content": "Ice."}]
    r2 = asyncio.run(s.chat(m2, None, ASK))
    assert r2.prompt_ids[:len(r1.prompt_ids) + len(c1)] == r1.prompt_ids + c1  # the sampled ids, verbatim
    closing = tok.encode("\n", add_special_tokens=False)  # the template's text after the EOS it generated
    rest = tok.encode(render(tok, m2, None, True)[len(render(tok, m2[:2], None, False)):], add_special_tokens=False)
    assert r2.prompt_ids == r1.prompt_ids + c1 + closing + rest
    assert not r2.new_segment and s.segments == 0
    m3 = [{"role": "user", "content": "Summary: at row 1."}]  # the agent dropped its history
    r3 = asyncio.run(s.chat(m3, None, ASK))
    assert r3.new_segment and s.segments == 1
    assert r3.prompt_ids == tok.apply_chat_template(m3, add_generation_prompt=True, return_dict=False)
    s.add_env_reward(0.5)  # credited to the latest reply
    records = s.records()
    assert len(records) == 2
    first, second = records[0][0], records[1][0]
    assert [first.token_ids[a:b] for a, b in segments(first.loss_mask)] == [c1, r2.choices[0].completion.token_ids]
    assert first.token_ids[:len(r2.prompt_ids)] == r2.prompt_ids
    assert second.token_ids == r3.prompt_ids + r3.choices[0].completion.token_ids + closing  # ends as a Conversation
    assert first.rewards == [0.0, 0.5] and second.rewards == [0.5]  # earlier segments carry later rewards
    assert [r.rewards for r, _, _ in s.records(final_reward=2.0)] == [[0.0, 2.0], [2.0]]


TOOL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "move", "parameters": {"type": "object"}}}]


def test_tool_calls_are_parsed_for_the_client_and_trained_on_the_sampled_ids(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = TOOL_TEMPLATE
    raw = 'Going.<tool_call>{"name":"move","arguments":{"dir":"left"}}</tool_call>'  # not the template's spacing
    s = _session(tok, [raw, "<answer>done</answer>"])
    m1 = [{"role": "user", "content": "Where to?"}]
    r1 = asyncio.run(s.chat(m1, TOOLS, ASK))
    choice = r1.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.content == "Going."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in choice.tool_calls] == [("move", '{"dir": "left"}')]
    # The client sends back what it got (as the openai client does) and the tool's answer.
    m2 = m1 + [{"role": "assistant", "content": choice.content, "tool_calls": choice.tool_calls},
               {"role": "tool", "tool_call_id": choice.tool_calls[0]["id"], "content": "moved"}]
    r2 = asyncio.run(s.chat(m2, TOOLS, ASK))
    c1 = choice.completion.token_ids
    assert not r2.new_segment and r2.prompt_ids[:len(r1.prompt_ids) + len(c1)] == r1.prompt_ids + c1
    assert tok.decode(r2.prompt_ids[len(r1.prompt_ids) + len(c1):]).startswith("\n<|im_start|>tool\nmoved")


def test_n_choices_continue_with_the_one_the_agent_kept_and_stop_strings_bridge(tiny_tokenizer):
    tok = tiny_tokenizer
    stopped = tok.encode("go STOP", add_special_tokens=False)
    s = _session(tok, ["<answer>Left</answer>", "<answer>Right</answer>",
                       Completion(stopped, [0.0] * len(stopped), "stop", stop_reason="STOP"), "<answer>Up</answer>"])
    m1 = [{"role": "user", "content": "Pick."}]
    r1 = asyncio.run(s.chat(m1, None, RequestSampling(n=2, max_tokens=8)))
    kept = r1.choices[1]
    m2 = m1 + [{"role": "assistant", "content": kept.content}, {"role": "user", "content": "Again."}]
    r2 = asyncio.run(s.chat(m2, None, RequestSampling(max_tokens=8, stop=("STOP",))))
    assert s.turns[0].chosen == 1 and not r2.new_segment
    assert r2.prompt_ids[len(r1.prompt_ids):][:len(kept.completion.token_ids)] == kept.completion.token_ids
    assert r2.choices[0].content == "go "  # OpenAI leaves the stop string out ...
    m3 = m2 + [{"role": "assistant", "content": "go "}, {"role": "user", "content": "More."}]
    r3 = asyncio.run(s.chat(m3, None, ASK))
    assert not r3.new_segment  # ... and the reply without it still continues the sampled ids
    assert r3.prompt_ids[:len(r2.prompt_ids) + len(stopped)] == r2.prompt_ids + stopped


def test_no_room_for_a_reply_gives_an_empty_cut_off_one(tiny_tokenizer):
    class Full:
        def plan(self, turn, prompt_len, generated, request):
            return "context"
    s = SessionStore().open(tiny_tokenizer, Scripted(tiny_tokenizer, []), None, Full())
    r = asyncio.run(s.chat([{"role": "user", "content": "x"}], None, ASK))
    assert r.choices[0].finish_reason == "length" and r.choices[0].completion.token_ids == []
    assert s.stop_reason == "context" and s.turns == []
