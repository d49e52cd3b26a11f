"""Imports flow one way (DESIGN.md); this test walks every module and fails on a wrong one."""

import ast
from pathlib import Path

import agentrl

ROOT = Path(agentrl.__file__).parent

# package -> packages (or top modules) it must not import, directly or under TYPE_CHECKING-free code
FORBIDDEN = {
    "algos": {"envs", "agents", "models", "llm", "rollout", "train", "runtime", "cli", "metrics"},
    "envs": {"agents", "llm", "rollout", "train", "runtime", "models", "algos", "cli", "torch"},
    "llm": {"envs", "agents", "rollout", "train", "runtime", "algos", "cli"},
    "agents": {"rollout", "train", "runtime", "algos", "models", "cli"},
    # tools are plain functions and their sandbox: no part of the loop, no model, no torch
    "tools": {"envs", "agents", "llm", "rollout", "train", "runtime", "algos", "models", "cli", "torch"},
    "rollout": {"train", "runtime", "algos", "models", "cli"},
    # the trainer reaches the engine only through its rollout source (rollout/source.py)
    "train": {"envs", "agents", "llm", "runtime", "cli"},
    "models": {"envs", "agents", "rollout", "train", "runtime", "algos", "cli"},
    "runtime": {"cli"},
    # the config is plain data and its checks: no part of the loop, no server, engine, Ray or torch
    "config": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "torch", "ray",
               "fastapi", "uvicorn", "httpx", "openai"},
    # the episode record is the bottom of the tree: everything may import it, it imports nothing of ours
    "trajectory": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "config",
                   "registry", "metrics", "errors", "api", "torch"},
    # the tokenizer type and the atomic writer sit at the bottom with it: every layer names them
    "tokenizer": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "config",
                  "registry", "metrics", "errors", "api", "trajectory", "torch", "transformers"},
    "atomic": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "config",
               "registry", "metrics", "errors", "api", "trajectory", "torch"},
    # bounded JSON parsing, for the tools (which may not import llm) as for the parser of tool calls
    "bounded_json": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "config",
                     "registry", "metrics", "errors", "api", "trajectory", "tools", "torch"},
    # what a run leaves for people to read: no torch, so `agentrl view` and the alarms' maths stay light
    "dumps": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "torch"},
    "health": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "config", "torch"},
    "viewer": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "torch"},
    "wandb_sink": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "torch"},
    # the warm start trains the embedded model on demonstrations played through the run's collector:
    # it reads the plan and the collector from runtime/assembly/, whose policy.py calls it once
    "warm_start": {"cli"},
}
# ... and sits above the loop: no layer below the runtime imports it
for _layer in ("algos", "envs", "llm", "agents", "tools", "rollout", "train", "models", "config"):
    FORBIDDEN[_layer] = FORBIDDEN[_layer] | {"warm_start"}


def _imports(path: Path) -> set[str]:
    """Top-level targets imported at run time (imports under `if TYPE_CHECKING:` are types only)."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            found.add(parts[1] if parts[0] == "agentrl" and len(parts) > 1 else parts[0])
    return found


def test_imports_flow_one_way():
    bad = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        pkg = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        targets = _imports(path)
        for target in FORBIDDEN.get(pkg, set()) & targets:
            bad.append(f"{rel} imports {target}")
        if "cli" in targets and rel.stem != "cli":
            bad.append(f"{rel} imports cli")
    assert not bad, "imports against DESIGN.md:\n" + "\n".join(sorted(bad))


def test_the_checker_sees_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import torch\nfrom agentrl.train.batch import pack\nif TYPE_CHECKING:\n    import agentrl.envs\n")
    assert _imports(f) == {"torch", "train"}


def test_every_module_says_its_one_job():
    """Modules are cut by job (STYLE.md): each opens with a docstring whose first line names that
    job, so a reader finds a room from the tree and a file from its first line."""
    vague = {}
    for p in ROOT.rglob("*.py"):
        doc = ast.get_docstring(ast.parse(p.read_text())) or ""
        first = doc.strip().splitlines()[0] if doc.strip() else ""
        if len(first.split()) < 3:
            vague[str(p.relative_to(ROOT))] = first
    assert not vague, f"modules without a first docstring line naming their job: {vague}"


def test_no_module_grows_past_a_sitting():
    """A generous size warning, not a cut: a module past 600 lines holds more than one job."""
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"modules over 600 lines: {long}; split them by job"


def test_the_trainer_never_asks_which_rollout_or_engine_it_has():
    """Trainer.step is written once for every rollout source and engine (their contracts)."""
    src = (ROOT / "train" / "trainer.py").read_text()
    for sign in ("isinstance(self.rollout", "self.stream", "StreamSource", "OnPolicySource", "engine: Any",
                 "LocalEngine", "RemoteEngine"):
        assert sign not in src, f"train/trainer.py tests its rollout mode or engine kind ({sign!r})"


# ---------------------------------------------------------------------------- import circles
# Circles that close only through imports under `if TYPE_CHECKING:` (arrows that run up for type
# hints), each named by all its modules: none today; one listed here must be one that goes.
TYPE_ONLY_CIRCLES: set[frozenset[str]] = set()


def _modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module of the package under `root` (a package by its own name)."""
    out = {}
    for path in root.rglob("*.py"):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _targets(name: str, is_package: bool, node: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The package's modules one import statement (or `importlib.import_module("...")`) loads."""
    if isinstance(node, ast.Import):
        found = {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from the module's package, one level up per extra dot
            here = name.split(".")[: len(name.split(".")) - node.level + is_package]
            base = ".".join(here + ([node.module] if node.module else []))
        # `from pkg import module` is an arrow to the module (pkg loads first, as for any pkg.module);
        # `from pkg import name` one to pkg
        found = {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    elif (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args
          and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        found = {node.args[0].value}
    else:
        return set()
    return {t for t in found if t in modules and t != name}


def import_graph(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(every arrow, the arrows that load at run time) between the package's modules: an import
    anywhere in a module (top level or inside a function) is an arrow; one under
    `if TYPE_CHECKING:` is an arrow for type hints only."""
    modules = _modules(root)
    every = {m: set() for m in modules}
    runtime = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        hints_only = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                hints_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
        for node in ast.walk(tree):
            targets = _targets(name, path.name == "__init__.py", node, modules)
            every[name] |= targets
            if id(node) not in hints_only:
                runtime[name] |= targets
    return every, runtime


def tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of two or more modules that each reach every other (strongly connected)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = {stack.pop()}
            while v not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def circle(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start = min(group)
    came = {start: None}
    queue = [start]
    for v in queue:
        for w in sorted(graph[v] & group):
            if w == start:
                path = [v]
                while came[path[-1]] is not None:
                    path.append(came[path[-1]])
                return [*reversed(path), start]
            if w not in came:
                came[w] = v
                queue.append(w)
    raise AssertionError(f"{sorted(group)} is no circle")


def test_no_import_circle():
    """No module imports, directly or through others, a module that imports it back: at the top
    or inside a function alike (a function-local import only hides a circle)."""
    graph = import_graph(ROOT)[1]
    found = [" -> ".join(circle(group, graph)) for group in tangles(graph)]
    assert not found, "import circles:\n" + "\n".join(found)


def test_type_hints_close_no_circle_but_the_known_ones():
    """Counting the imports under TYPE_CHECKING too, the only circles are the known ones, whose
    upward arrows are type hints only."""
    graph = import_graph(ROOT)[0]
    found = {frozenset(group): " -> ".join(circle(group, graph)) for group in tangles(graph)}
    new = [f"{text} (all of {sorted(group)})" for group, text in found.items() if group not in TYPE_ONLY_CIRCLES]
    assert not new, "import circles, counting TYPE_CHECKING imports:\n" + "\n".join(new)
    gone = [sorted(group) for group in TYPE_ONLY_CIRCLES if group not in found]
    assert not gone, f"these circles are gone: take them out of TYPE_ONLY_CIRCLES: {gone}"


# Rooms inside a package import its top (llm/engine.py, conversation.py, weights.py; runtime/process.py),
# never a sibling room: the in-process engine, the server and the client of servers stand alone, and
# runtime/assembly/ knows nothing of the runtimes that place what it builds. One arrow between rooms is
# the rule's one exception: vLLM's engine (llm/vllm/) generates through the client of servers, and
# the client knows nothing of vLLM's engine. The warm start (warm_start/) is a room of runtime/assembly/'s
# kind: it knows nothing of the runtimes either.
ROOMS = {
    "agentrl.llm.local": ("agentrl.llm.server", "agentrl.llm.remote", "agentrl.llm.vllm"),
    "agentrl.llm.server": ("agentrl.llm.local", "agentrl.llm.remote", "agentrl.llm.vllm"),
    "agentrl.llm.remote": ("agentrl.llm.local", "agentrl.llm.server", "agentrl.llm.vllm"),
    "agentrl.llm.vllm": ("agentrl.llm.local", "agentrl.llm.server"),
    "agentrl.runtime.assembly": ("agentrl.runtime.ray", "agentrl.runtime.local", "agentrl.runtime.serving",
                              "agentrl.runtime.export"),
    "agentrl.warm_start": ("agentrl.runtime.ray", "agentrl.runtime.local", "agentrl.runtime.serving",
                           "agentrl.runtime.export"),
}


def test_rooms_import_no_sibling_room():
    graph = import_graph(ROOT)[0]  # type hints count: a room is read alone
    bad = [f"{module} imports {target}" for module, targets in sorted(graph.items())
           for room, banned in ROOMS.items() if module.startswith(room + ".")
           for target in sorted(targets) if any(target == b or target.startswith(b + ".") for b in banned)]
    assert not bad, "a room imports a sibling room:\n" + "\n".join(bad)


def test_the_circle_finder_names_a_circle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nimport importlib\n"
                              "importlib.import_module('pkg.d')\nif TYPE_CHECKING:\n    import pkg.a\n")
    (pkg / "d.py").write_text("import pkg.sub.b\n")
    every, runtime = import_graph(pkg)
    assert runtime["pkg.a"] == {"pkg.sub.b"} and every["pkg.c"] == {"pkg.a", "pkg.d"}
    assert [circle(group, runtime) for group in tangles(runtime)] == [["pkg.c", "pkg.d", "pkg.sub.b", "pkg.c"]]
    assert tangles(every) == [{"pkg.a", "pkg.sub.b", "pkg.c", "pkg.d"}]
    assert circle(tangles(every)[0], every) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
