"""Token exactness: trajectories hold exactly the engine's ids, and the mask covers exactly them."""

import asyncio

import pytest

from agentrl.agents.chat import ChatAgent
from agentrl.errors import ConfigError
from agentrl.llm.conversation import Conversation
from agentrl.llm.engine import Completion, SamplingParams
from agentrl.llm.local.engine import LocalEngine
from agentrl.trajectory import Task
from helpers import RecordingEngine, segments


class CountdownEnv:
    """A three-turn text env: any reply moves on; the last turn ends the episode."""

    instructions = "Say anything."

    async def reset(self, seed=None, options=None):
        self.left = 3
        return f"{self.left} turns left", {}

    async def step(self, action):
        self.left -= 1
        done = self.left == 0
        return f"{self.left} turns left", float(len(action) % 3), done, False, {"success": done}

    def sample_action(self, rng):
        return "ok"

    def close(self):
        pass


def test_trajectory_ids_are_exactly_the_engine_outputs(tiny_model, tiny_tokenizer):
    engine = RecordingEngine(LocalEngine(tiny_model, eos_token_ids=(tiny_tokenizer.eos_token_id,),
                                         pad_token_id=tiny_tokenizer.pad_token_id))
    agent = ChatAgent(tiny_tokenizer, SamplingParams(max_new_tokens=6), max_turns=5)
    traj = asyncio.run(agent.run_episode(Task(env_seed=0, group_id=0, sampling_seed=3), CountdownEnv(), engine))
    assert traj.num_turns == 3 and len(engine.calls) == 3
    segs = segments(traj.loss_mask)
    assert len(segs) == 3
    for (start, end), (prompt, out) in zip(segs, engine.calls):
        assert traj.token_ids[start:end] == out.token_ids  # generated ids verbatim
        assert traj.logprobs[start:end] == out.logprobs
        assert traj.token_ids[:start] == prompt  # the prompt was exactly the sequence so far
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask) if not m)
    for (start, end), pos in zip(segs, traj.reward_positions):
        assert pos == end - 1  # each turn's reward sits on its last generated id


def test_closing_tokens_after_eos_and_after_truncation(tiny_tokenizer):
    tok = tiny_tokenizer
    conv = Conversation(tok)
    conv.add_message("user", "hi")
    reply = tok.encode("<answer>Left</answer>", add_special_tokens=False)
    text = conv.add_completion(Completion(reply + [tok.eos_token_id], [-0.1] * (len(reply) + 1), "stop"),
                               (tok.eos_token_id,))
    assert text == "<answer>Left</answer>"
    expected = tok.apply_chat_template([{"role": "user", "content": "hi"},
                                        {"role": "assistant", "content": text}], return_dict=False)
    assert conv.token_ids == expected  # with EOS generated, only the template's newline is added
    conv.add_message("user", "again")
    conv.add_completion(Completion(reply[:2], [-0.2, -0.3], "length"), (tok.eos_token_id,))
    # a reply cut off without EOS is closed by the template's own end-of-turn ids (mask 0)
    assert conv.token_ids[-2] == tok.eos_token_id and conv.loss_mask[-2] == 0
    assert sum(conv.loss_mask) == len(reply) + 1 + 2


def test_non_prefix_preserving_template_is_reported(tiny_tokenizer):
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    # a template that only ever shows the last message: turn k+1 does not extend turn k
    tok.chat_template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>{% endif %}"
    conv = Conversation(tok)
    conv.add_message("user", "first")
    with pytest.raises(ConfigError, match="prefix-preserving"):
        conv.add_message("user", "second")


@pytest.mark.parametrize("state", ["plain", "split_special_tokens", "backend_padding"])
def test_encode_text_gives_the_ids_of_tokenizer_encode(tiny_tokenizer, state):
    import copy

    from agentrl.llm.conversation import encode_text

    tok = copy.deepcopy(tiny_tokenizer)
    if state == "split_special_tokens":
        tok.split_special_tokens = True  # special tokens in text are then spelled out
    elif state == "backend_padding":
        tok.backend_tokenizer.enable_padding(length=64, pad_id=tok.pad_token_id)  # left on by a user's batch call
    texts = ["", "P _ _ G\nO _ _ _", "<answer>Left</answer>", f"{tok.eos_token}\nnext", "  ünïcödé ← ↓  "]
    ours = [encode_text(tok, text) for text in texts]  # first: tokenizer.encode changes the backend's state
    assert (ours[3][0] != tok.eos_token_id) == (state == "split_special_tokens")
    assert ours == [tok.encode(text, add_special_tokens=False) for text in texts], state


# Qwen2.5-Instruct's tool branches, shortened: the tools in the first system message, and a run of
# tool messages rendered as one user turn, closed only after its last message.
QWEN_TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n{% endif %}"
    "{%- for m in messages %}{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% elif not (tools and loop.first and m.role == 'system') %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "python", "description": "Run code.",
                                            "parameters": {"type": "object", "properties": {}}}}]


def test_a_run_of_tool_answers_is_appended_at_once_with_the_tools_rendered(tiny_tokenizer):
    import copy

    from agentrl.llm.conversation import check_chat_template

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = QWEN_TOOL_TEMPLATE
    check_chat_template(tok, "Be brief.", tools=TOOLS)  # the tool agent's shape is prefix-preserving here
    conv = Conversation(tok, tools=TOOLS)
    conv.add_message("system", "Be brief.")
    conv.add_message("user", "What is 6 * 7?")
    call = tok.encode('<tool_call>{"name": "python", "arguments": {}}</tool_call>', add_special_tokens=False)
    conv.add_completion(Completion(call + [tok.eos_token_id], [-0.1] * (len(call) + 1), "stop"), (tok.eos_token_id,))
    conv.add_messages([{"role": "tool", "content": "42"}, {"role": "tool", "content": "done"}])
    rendered = tok.apply_chat_template(conv.messages, tools=TOOLS, tokenize=False)
    assert tok.decode(conv.token_ids) == rendered and rendered.count('"description": "Run code."') == 1
    assert "Be brief.\n\n# Tools" in rendered
    assert rendered.endswith("<|im_start|>user<tool_response>\n42\n</tool_response><tool_response>\ndone\n"
                             "</tool_response><|im_end|>\n")  # (transformers trims the newline after a block tag)
    # one at a time, the first answer's closing would have to be taken back: not prefix-preserving
    conv = Conversation(tok, tools=TOOLS)
    conv.add_message("user", "What is 6 * 7?")
    conv.add_completion(Completion(call + [tok.eos_token_id], [-0.1] * (len(call) + 1), "stop"), (tok.eos_token_id,))
    conv.add_message("tool", "42")
    with pytest.raises(ConfigError, match="prefix-preserving"):
        conv.add_message("tool", "done")


def test_the_embedded_template_renders_tools_and_nothing_else_changes(tiny_tokenizer):
    from agentrl.llm.conversation import check_chat_template

    chatml = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
              "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "<answer>1</answer>"}, {"role": "tool", "content": "t"}]
    for gen in (True, False):  # without tools: ChatML exactly, as before tools existed
        assert tiny_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen) == \
            tiny_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, chat_template=chatml)
    with_tools = tiny_tokenizer.apply_chat_template(msgs, tools=TOOLS, tokenize=False)
    assert with_tools.startswith("<|im_start|>system\nS\n\n# Tools\n") and with_tools.count("<|im_start|>system") == 1
    assert '{"type": "function", "function": {"name": "python"' in with_tools and "<tool_call>" in with_tools
    assert with_tools.endswith("<|im_start|>tool\nt<|im_end|>\n")
    check_chat_template(tiny_tokenizer, None, tools=TOOLS)
    check_chat_template(tiny_tokenizer, "S", tools=TOOLS)
