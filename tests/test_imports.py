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
    "rollout": {"train", "runtime", "algos", "models", "cli"},
    # the trainer reaches the engine only through its rollout source (rollout/source.py)
    "train": {"envs", "agents", "llm", "runtime", "cli"},
    "models": {"envs", "agents", "rollout", "train", "runtime", "algos", "cli"},
    "runtime": {"cli"},
    # config sections are plain data: serving's may not pull in the server or an engine
    "config_serve": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "torch",
                     "fastapi", "uvicorn", "httpx", "openai"},
    # the runtime section of the config: plain data and its checks
    "config_runtime": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "ray",
                       "torch"},
    # the episode record is the bottom of the tree: everything may import it, it imports nothing of ours
    "trajectory": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "config",
                   "registry", "metrics", "errors", "api", "torch"},
    # what a run leaves for people to read: no torch, so `agentrl view` and the alarms' maths stay light
    "dumps": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "torch"},
    "health": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "config", "torch"},
    "viewer": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "torch"},
    "wandb_sink": {"algos", "envs", "agents", "llm", "rollout", "train", "runtime", "models", "cli", "torch"},
}


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


def test_modules_stay_small():
    """Small modules with one job (STYLE.md): none over 400 lines, so each reads in one sitting."""
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"modules over 400 lines: {long}; split them by job"


def test_the_trainer_never_asks_which_rollout_or_engine_it_has():
    """Trainer.step is written once for every rollout source and engine (their contracts)."""
    src = (ROOT / "train" / "trainer.py").read_text()
    for sign in ("isinstance(self.rollout", "self.stream", "StreamSource", "OnPolicySource", "engine: Any",
                 "LocalEngine", "RemoteEngine"):
        assert sign not in src, f"train/trainer.py tests its rollout mode or engine kind ({sign!r})"
