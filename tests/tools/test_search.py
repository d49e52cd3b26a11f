"""The search tool: BM25 ranking over a JSONL corpus, the on-disk index cache (reused for the same
content, rebuilt for a changed one or a damaged entry), and one-line refusals."""

import asyncio
import json
import os
import sys

import pytest

from agentrl.errors import ConfigError
from agentrl.registry import TOOLS
from agentrl.tools.search import FIELDS, load_index

DOCS = [{"id": "q", "title": "Quillmor", "text": "Quillmor is a company founded by Brin Kasso."},
        {"id": "b", "title": "Brin Kasso", "text": "Brin Kasso reports to the manager Sela Drun."},
        {"id": "s", "title": "Sela Drun", "text": "Sela Drun was born in Ostholm."},
        {"id": "o", "title": "Ostholm", "text": "Ostholm is a city by the sea, with a harbour and a bridge."}]


def _corpus(path, docs=DOCS):
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


def _search(corpus, cache, query, **settings):
    import agentrl.tools.search  # noqa: F401 (registers the tool)

    tool = TOOLS.get("search").configure({"corpus": str(corpus), "cache_dir": str(cache), **settings},
                                         "tool_args.search")
    tool.start()
    return asyncio.run(tool.run({"query": query}))


def test_search_ranks_the_document_that_names_the_query_first(tmp_path):
    corpus = _corpus(tmp_path / "docs.jsonl")
    assert _search(corpus, tmp_path / "cache", "Brin Kasso", top_k=1) == \
        "Brin Kasso: Brin Kasso reports to the manager Sela Drun."
    hits = _search(corpus, tmp_path / "cache", "where was Sela Drun born?", top_k=2).split("\n\n")
    assert hits[0].startswith("Sela Drun: ") and len(hits) == 2
    assert _search(corpus, tmp_path / "cache", "harbour", max_chars=20) == "Ostholm: Ostholm is ..."
    assert _search(corpus, tmp_path / "cache", "zebra") == "No document matches 'zebra'."


def test_the_index_is_cached_by_content_and_rebuilt_when_the_corpus_changes(tmp_path):
    cache = tmp_path / "cache"
    first = load_index(str(_corpus(tmp_path / "a.jsonl")), str(cache))
    assert first.built
    again = load_index(str(_corpus(tmp_path / "b.jsonl")), str(cache))  # the same documents in another file
    assert not again.built and again.folder == first.folder
    assert [d.id for d, _ in again.search("Quillmor", 1)] == ["q"]

    changed = _corpus(tmp_path / "a.jsonl", [*DOCS, {"id": "n", "title": "Norvik", "text": "Norvik makes boats."}])
    rebuilt = load_index(str(changed), str(cache))
    assert rebuilt.built and rebuilt.folder != first.folder
    assert [d.id for d, _ in rebuilt.search("Norvik boats", 1)] == ["n"]


def test_a_damaged_cache_entry_is_built_again(tmp_path):
    cache = tmp_path / "cache"
    first = load_index(str(_corpus(tmp_path / "a.jsonl")), str(cache))
    for f in first.folder.iterdir():
        f.write_text("{not an index")
    again = load_index(str(_corpus(tmp_path / "b.jsonl")), str(cache))
    assert again.built and [d.id for d, _ in again.search("Ostholm harbour", 1)] == ["o"]


@pytest.mark.parametrize("line, problem", [
    ("{not json", "is not JSON"),
    ('{"title": "no text"}', 'has no string "text"'),
    ('["a", "list"]', 'has no string "text"'),
    ('{"text": "t", "title": 3}', '"title" must be a string'),
])
def test_a_bad_corpus_line_is_one_line_naming_the_file_line_and_fields(tmp_path, line, problem):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps(DOCS[0]) + "\n\n" + line + "\n")
    with pytest.raises(ConfigError) as e:
        _search(corpus, tmp_path / "cache", "x")
    message = str(e.value)
    assert "\n" not in message and f"{corpus} line 3" in message and problem in message
    assert '"text" (a string, required), "title" (a string) and "id"' in message


def test_a_missing_corpus_or_bad_setting_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"tool_args.search.corpus is not set: give a JSONL file"):
        TOOLS.get("search").start()
    with pytest.raises(ConfigError, match=r"corpus='.*nowhere.jsonl' cannot be read \(No such file"):
        _search(tmp_path / "nowhere.jsonl", tmp_path / "cache", "x")
    with pytest.raises(ConfigError, match=r"tool_args.search.top_k=0: expected an int > 0"):
        _search(_corpus(tmp_path / "a.jsonl"), tmp_path / "cache", "x", top_k=0)


def test_without_bm25s_the_tool_names_the_extra_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "bm25s", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ConfigError) as e:
        _search(_corpus(tmp_path / "fresh.jsonl", DOCS[:2]), tmp_path / "cache", "x")
    assert str(e.value) == ("the search tool needs the bm25s library, which is not installed: "
                            "pip install 'agentrl[tools]'")


def test_the_tool_agent_refuses_a_bad_corpus_before_any_work(tmp_path):
    from agentrl.agents.tool import ToolAgent
    from agentrl.llm.engine import SamplingParams

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('{"title": "no text"}\n')
    with pytest.raises(ValueError, match=r"docs.jsonl line 1 has no string \"text\""):
        ToolAgent(None, SamplingParams(), max_turns=1, tools=["search"],
                  tool_args={"search": {"corpus": str(corpus), "cache_dir": str(tmp_path / "cache")}})


def test_agentrl_plan_names_the_bad_corpus_line_not_the_tool_list(tmp_path, capsys):
    from agentrl.cli import main

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps(DOCS[0]) + "\n" + '{"title": "no text"}\n')
    code = main(["plan", "configs/tool_search.yaml", f"env.args.corpus_path={tmp_path / 'world.jsonl'}",
                 f"agent.args.tool_args.search.corpus={corpus}",
                 f"agent.args.tool_args.search.cache_dir={tmp_path / 'cache'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f'{corpus} line 2 has no string "text"' in err[0] and "tools=" not in err[0]


def _start(corpus, cache, preflight, **settings):
    """Start the search tool as a run's agent does, or as the preflight (`agentrl plan`) does."""
    import agentrl.tools.search  # noqa: F401 (registers the tool)

    tool = TOOLS.get("search").configure({"corpus": str(corpus), "cache_dir": str(cache), **settings},
                                         "tool_args.search")
    if preflight:
        from agentrl.tools.tool import check_only

        with check_only():
            tool.start()
    else:
        tool.start()


@pytest.mark.parametrize("preflight", [False, True], ids=["tool", "preflight"])
@pytest.mark.parametrize("kind", ["a character device", "a FIFO", "a folder"])
def test_a_corpus_that_is_not_a_regular_file_is_refused_in_one_line_without_reading_it(tmp_path, kind, preflight):
    # /dev/zero was read without end (1.3 GB before it was killed); a FIFO without a writer hung
    if kind == "a FIFO":
        corpus = tmp_path / "pipe.jsonl"
        os.mkfifo(corpus)
    else:
        corpus = "/dev/zero" if kind == "a character device" else tmp_path
    with pytest.raises(ConfigError) as e:
        _start(corpus, tmp_path / "cache", preflight)
    assert str(e.value) == (f"tool_args.search.corpus={str(corpus)!r} is {kind}; give a regular JSONL file of "
                            f'documents, one object a line with {FIELDS}')


@pytest.mark.parametrize("preflight", [False, True], ids=["tool", "preflight"])
def test_a_corpus_over_max_corpus_mb_is_refused_in_one_line(tmp_path, preflight):
    corpus = _corpus(tmp_path / "big.jsonl", [{"text": "word " * 300_000}])  # 1.4 MB
    with pytest.raises(ConfigError) as e:
        _start(corpus, tmp_path / "cache", preflight, max_corpus_mb=1)
    assert str(e.value) == (f"tool_args.search.corpus={str(corpus)!r} is 1.4 MB, over tool_args.search.max_corpus_mb=1;"
                            " raise max_corpus_mb (memory permitting) or give a smaller corpus")
    _start(corpus, tmp_path / "cache", preflight, max_corpus_mb=2)
    from agentrl.tools.search import MAX_CORPUS_MB

    assert MAX_CORPUS_MB == TOOLS.get("search").settings["max_corpus_mb"] == 1024  # the default


@pytest.mark.parametrize("preflight", [False, True], ids=["tool", "preflight"])
@pytest.mark.parametrize("text, problem", [
    ("", "holds no documents; each line is an object with " + FIELDS),
    ("\n  \n", "holds no documents; each line is an object with " + FIELDS),
    ('{"text": "the of and"}\n{"title": "a", "text": "..."}\n',
     "holds no word to search by: each of its documents holds only stopwords (the, of, ...), punctuation or nothing"),
])
def test_an_empty_corpus_is_one_line_naming_the_file(tmp_path, capfd, text, problem, preflight):
    # it ended in `max() arg is an empty sequence` from inside bm25s, after numpy's warnings
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(text)
    with pytest.raises(ConfigError) as e:
        _start(corpus, tmp_path / "cache", preflight)
    assert str(e.value) == f"search corpus {corpus} {problem}"
    assert "Warning" not in capfd.readouterr().err


def test_a_corpus_line_nesting_a_thousand_deep_is_one_line(tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps(DOCS[0]) + "\n" + '{"text": "x", "id": ' + "[" * 1000 + "]" * 1000 + "}\n")
    with pytest.raises(ConfigError, match=r"docs.jsonl line 2 is not JSON \(arrays and objects nest deeper than 64"):
        _start(corpus, tmp_path / "cache", preflight=False)


def test_agentrl_plan_checks_the_corpus_and_builds_no_index(tmp_path, capsys):
    from agentrl.agents.tool import offer_tools
    from agentrl.cli import main

    corpus, cache = tmp_path / "world.jsonl", tmp_path / "cache"
    args = ["plan", "configs/tool_search.yaml", f"env.args.corpus_path={corpus}",
            f"agent.args.tool_args.search.corpus={corpus}", f"agent.args.tool_args.search.cache_dir={cache}"]
    assert main(args) == 0, capsys.readouterr().err
    assert corpus.is_file()  # the env wrote it, the plan read and checked it
    assert not (cache / "search").exists()  # and indexed nothing (it built the index into the cache)
    # the run builds it when it builds its agents (which start their tools so)
    offer_tools(["search"], {"search": {"corpus": str(corpus), "cache_dir": str(cache)}}, 30.0, None)
    assert len(list((cache / "search").iterdir())) == 1
    # a corpus the index could not be built from fails the plan, in one line
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    capsys.readouterr()
    assert main([*args[:3], f"agent.args.tool_args.search.corpus={empty}",
                 f"agent.args.tool_args.search.cache_dir={cache}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"search corpus {empty} holds no documents" in err[0], err
