"""The tool tasks' envs: `products` and `multihop` keep the env contract (check_env); multihop's
world and corpus come from its seed and the search tool finds each hop; and their warm-start
demonstrations, played through the real tool agent, call the tool, hear its real answer and
answer right (without tools: one well-formed answer)."""

import json

import pytest

from agentrl.agents.tool import ToolAgent
from agentrl.envs.checker import check_env
from agentrl.envs.multihop import MultihopEnv
from agentrl.envs.products import ProductsEnv
from agentrl.errors import ConfigError
from agentrl.llm.engine import SamplingParams
from agentrl.rollout.collector import RolloutCollector
from agentrl.rollout.demos import ScriptedClient
from agentrl.rollout.tasks import make_tasks
from agentrl.tools.search import load_index
from helpers import bwrap_problem


def test_products_keeps_the_env_contract():
    check_env(ProductsEnv)


def test_multihop_keeps_the_env_contract(tmp_path):
    check_env(lambda: MultihopEnv(n_companies=20, n_people=30, corpus_path=str(tmp_path / "corpus.jsonl")))


def test_multihop_world_and_corpus_come_from_the_seed_and_search_finds_each_hop(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    MultihopEnv(world_seed=3, corpus_path=str(a))
    MultihopEnv(world_seed=3, corpus_path=str(b))
    assert a.read_text() == b.read_text()
    MultihopEnv(world_seed=4, corpus_path=str(b))  # another world: the file is written again
    assert a.read_text() != b.read_text()
    docs = [json.loads(line) for line in a.read_text().splitlines()]
    assert len(docs) == 200 + 300 and set(docs[0]) == {"id", "title", "text"}

    env = MultihopEnv(world_seed=3)
    index = load_index(str(a), str(tmp_path / "cache"))
    w = env.world
    for company in w.companies:  # the first hop: the company's document names its founder
        founder = w.founder[company]
        assert index.search(company, 1)[0][0].text == f"{company} is a company founded by {founder}."
        person = index.search(founder, 1)[0][0]  # the second: the founder's names the answers
        assert person.title == founder and f"manager {w.manager[founder]}." in person.text
        assert f"born in {w.born[founder]}." in person.text


def test_multihop_writes_its_corpus_again_when_it_is_gone(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.jsonl"
    MultihopEnv(n_companies=5, n_people=8, corpus_path=str(corpus))
    written = corpus.read_text()
    corpus.unlink()  # a run folder cleaned, or the same relative path in another folder
    MultihopEnv(n_companies=5, n_people=8, corpus_path=str(corpus))
    assert corpus.read_text() == written
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    MultihopEnv(n_companies=5, n_people=8, corpus_path="world.jsonl")
    monkeypatch.chdir(tmp_path / "elsewhere")
    MultihopEnv(n_companies=5, n_people=8, corpus_path="world.jsonl")
    assert (tmp_path / "elsewhere" / "world.jsonl").read_text() == written


async def test_multihop_grades_the_name_folding_case_and_spaces():
    env = MultihopEnv(n_companies=5, n_people=8, n_cities=3)
    question, info = await env.reset(seed=7)
    assert question.endswith("?") and "founder of" in question
    right = env.answer
    _, reward, done, _, step_info = await env.step(f"<answer>  {right.upper()} </answer>")
    assert (reward, done, step_info["success"]) == (1.0, True, True)
    _, reward, _, _, step_info = await env.step(right)  # no answer tag: a format penalty
    assert (reward, step_info["success"], step_info["action_valid"]) == (-0.1, False, False)


def test_multihop_refuses_bad_sizes_in_one_line():
    with pytest.raises(ConfigError, match=r"^multihop: n_people=1 must be an integer from 2 to 5000$"):
        MultihopEnv(n_people=1)


def _play(tokenizer, make_env, tools, tool_args=None, n=4):
    """Episodes of the warm start's scripted demonstrations through the real tool agent."""
    client = ScriptedClient(tokenizer)
    agent = ToolAgent(tokenizer, SamplingParams(max_new_tokens=4096), max_turns=1, tools=tools,
                      tool_args=tool_args, max_tool_calls=2)
    collector = RolloutCollector.single(client.wrap(make_env, tools), agent, client)
    client.reset_entropy()
    return collector.collect(make_tasks(0, 0, n, 1)).trajectories


def _between(traj, tokenizer):
    """The text we wrote between replies (the tool answers), per gap."""
    gaps, start = [], None
    for i, m in enumerate([*traj.loss_mask, 1]):
        if not m and start is None:
            start = i
        if m and start is not None:
            gaps.append(tokenizer.decode(traj.token_ids[start:i]))
            start = None
    return gaps[1:-1]  # not the prompt before the first reply, nor what follows the last


def test_multihop_demonstrations_search_twice_then_answer_right(tmp_path, tiny_tokenizer):
    corpus = str(tmp_path / "corpus.jsonl")
    MultihopEnv(corpus_path=corpus)  # writes the corpus, as a run's preflight does before building agents
    trajs = _play(tiny_tokenizer, lambda: MultihopEnv(corpus_path=corpus), ["search"],
                  {"search": {"corpus": corpus, "cache_dir": str(tmp_path / "cache"), "top_k": 1}})
    assert len(trajs) == 4
    for traj in trajs:
        assert traj.success and traj.info["metrics"]["tools/calls"] == 2
        assert traj.info["metrics"]["tools/malformed"] == traj.info["metrics"]["tools/errors"] == 0
        company_doc, person_doc = _between(traj, tiny_tokenizer)
        assert " is a company founded by " in company_doc and " reports to the manager " in person_doc


def test_products_demonstrations_call_python_then_answer_right(tiny_tokenizer):
    problem = bwrap_problem()
    if problem is not None:
        pytest.skip(f"bubblewrap cannot run here: {problem}")
    for traj in _play(tiny_tokenizer, ProductsEnv, ["python"]):
        assert traj.success and traj.info["metrics"]["tools/calls"] == 1
        [gap] = _between(traj, tiny_tokenizer)
        printed = gap.split("<|im_start|>tool\n")[1].split("<|im_end|>")[0]
        assert printed.strip().isdigit() and 10_000 <= int(printed) <= 998_001  # python's output: the product


def test_without_tools_the_demonstration_is_one_answer(tmp_path, tiny_tokenizer):
    for traj in _play(tiny_tokenizer, lambda: MultihopEnv(n_companies=5, n_people=8), []):
        assert traj.info["metrics"]["tools/calls"] == 0 and sum(traj.loss_mask) > 0
        assert _between(traj, tiny_tokenizer) == []
