"""The README and docs/ as a user reads them: every Python block compiles (the README's API example
also runs, in tests/test_api.py), every `agentrl` command of a bash block parses with the CLI's
own parser and loads its config, every link between the pages leads somewhere, and the results
table has one row per shipped config. Nothing is trained: these take seconds."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from agentrl.cli import _parser, _split_config
from agentrl.config import load_config
from agentrl.errors import AgentRLError

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _blocks(lang: str) -> list[tuple[str, str]]:
    """(page:line, text) of every fenced block of `lang` in the README and docs/."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) == lang:
                found.append((f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 2}", m.group(2)))
    return found


def _commands() -> list[tuple[str, list[str]]]:
    """(page:line, the words after `agentrl`) of every `agentrl` command of a bash block; a line
    ending in a backslash continues on the next, `#` starts a comment, as in a shell."""
    found = []
    for where, text in _blocks("bash"):
        page, first = where.rsplit(":", 1)
        held, start = "", None
        for i, line in enumerate(text.splitlines()):
            start = i if start is None else start
            if line.endswith("\\"):
                held += line[:-1] + " "
                continue
            words = shlex.split(held + line, comments=True)
            if words and Path(words[0]).name == "agentrl":
                found.append((f"{page}:{int(first) + start}", words[1:]))
            held, start = "", None
    return found


PYTHON_BLOCKS = _blocks("python")
COMMANDS = _commands()


def test_the_pages_hold_what_these_tests_check():
    # an extraction that found nothing would let every test below pass
    assert sum(w.startswith("README.md:") for w, _ in COMMANDS) >= 6, COMMANDS
    assert sum(w.startswith("README.md:") for w, _ in PYTHON_BLOCKS) >= 3, PYTHON_BLOCKS
    assert len(COMMANDS) >= 25 and len(PYTHON_BLOCKS) >= 4
    assert {"train", "plan", "resume", "eval", "serve", "view", "export"} <= {argv[0] for _, argv in COMMANDS}


@pytest.mark.parametrize("where,code", PYTHON_BLOCKS, ids=[w for w, _ in PYTHON_BLOCKS])
def test_every_python_block_compiles(where, code):
    compile(code, where, "exec")


@pytest.mark.parametrize("where,argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_agentrl_command_parses_and_loads_its_config(where, argv, tmp_path, monkeypatch, capsys):
    """The command as `agentrl` reads it, up to the loaded config (nothing is built or trained):
    a renamed key, a config file or option that is gone, a value out of range fails here. It runs
    where `configs/` and `examples/` are the repository's; a `model.path` names a folder the user
    downloaded, stood in for by an empty one."""
    monkeypatch.chdir(tmp_path)
    for name in ("configs", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    shown = f"{where}: agentrl {shlex.join(argv)}"
    try:
        ns = _parser().parse_args(argv)
    except SystemExit as e:
        out = capsys.readouterr()
        assert e.code == 0 and "--help" in argv, f"{shown}: {out.err.strip()}"
        assert "config fields" in out.out
        return
    if ns.command in ("train", "plan", "serve"):
        path, overrides = _split_config(ns.args, getattr(ns, "config_path", None), getattr(ns, "config_name", None))
    elif ns.command in ("resume", "eval"):  # overrides of a run's own config: every key must exist
        path, overrides = None, ns.overrides
    else:  # view, export: a run folder and flags, all parsed above
        return
    for item in overrides:
        key, _, value = item.partition("=")
        if key == "model.path":
            (tmp_path / value).mkdir(parents=True, exist_ok=True)
    try:
        load_config(path, overrides)
    except AgentRLError as e:
        pytest.fail(f"{shown}: {e}")


def _anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub makes them."""
    text = FENCE.sub("", page.read_text())
    heads = re.findall(r"^#+ (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_every_link_between_the_pages_resolves_and_the_readme_maps_every_page():
    bad = []
    for page in PAGES:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path) if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)
    mapped = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall(README.read_text())}
    assert [p.name for p in PAGES[1:] if p.resolve() not in mapped] == []
    assert len(PAGES) >= 13  # README + the twelve pages of docs/


def _config_rows(page: Path, section: str) -> list[str]:
    """The config file named first in each row of the table under `## section` of `page`."""
    body = page.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("| `")]
    named = [re.match(r"\| `([\w.-]+\.yaml)`", row) for row in rows]
    assert all(named), [row for row, m in zip(rows, named) if not m]
    return [m.group(1) for m in named]


def test_the_results_table_and_the_configs_page_have_one_row_per_shipped_config():
    shipped = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    assert len(shipped) >= 11
    assert sorted(_config_rows(README, "Results")) == shipped
    assert sorted(_config_rows(ROOT / "docs" / "configs.md", "The shipped configs")) == shipped


def test_the_readme_s_claim_about_the_default_s_seeds_is_its_table_s():
    """The opening paragraph names as learning exactly the seeds the results table's row of the
    default config shows at the optimum (1.00), and no other: one truth on the page."""
    text = README.read_text()
    claim = re.search(r"the default\s+learns FrozenLake on (?:each of )?seeds? ((?:\d+(?:, | and ))*\d+)", text)
    assert claim, "the opening paragraph no longer says which seeds the default learns on"
    claimed = {int(s) for s in re.findall(r"\d", claim.group(1))}
    row = next(line for line in text.splitlines() if line.startswith("| `frozen_lake.yaml`"))
    seeds_cell, results_cell = row.split("|")[2], row.split("|")[3]
    seeds = [int(s) for s in re.findall(r"\d+", seeds_cell)]
    after = re.findall(r"\d\.\d\d", results_cell.split("→", 1)[1].split("(", 1)[0])
    assert len(after) == len(seeds), (seeds_cell, results_cell)
    assert claimed == {s for s, a in zip(seeds, after) if float(a) == 1.0}, (claimed, seeds, after)
