"""Name -> object registries for envs, agents, estimators and tools (one small class, no magic)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Generic, TypeVar, overload

from agentrl.errors import RegistryError, did_you_mean, shown

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of factories; unknown names fail with the known ones listed."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    @overload
    def register(self, name: str, item: T, *, overwrite: bool = False) -> T: ...

    @overload
    def register(self, name: str, item: None = None, *, overwrite: bool = False) -> Callable[[T], T]: ...

    def register(self, name: str, item: T | None = None, *, overwrite: bool = False) -> T | Callable[[T], T]:
        """Add `item` under `name` and return it; without `item`, a decorator that adds what it
        decorates (`@ENVS.register("name")`). Re-registering a name raises unless `overwrite`."""
        if item is None:
            return lambda f: self.register(name, f, overwrite=overwrite)
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self._items and self._items[name] is not item and not overwrite:
            raise RegistryError(
                f"{self.kind} '{name}' is already registered to {self._items[name]!r}; "
                "pick another name or pass overwrite=True"
            )
        self._items[name] = item
        return item

    def get(self, name: str) -> T:
        """Return the item under `name`, or raise listing the known names."""
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise RegistryError(
                f"unknown {self.kind} {shown(name)}.{did_you_mean(name, self._items)} Known: {known}"
            ) from None

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items


ENVS: Registry[Callable] = Registry("env type")
AGENTS: Registry[Callable] = Registry("agent type")
ESTIMATORS: Registry[Callable] = Registry("advantage estimator")
POLICY_LOSSES: Registry[Callable] = Registry("policy loss mode")
CURRICULUM_RULES: Registry[Callable] = Registry("curriculum rule")  # rule(estimate, seen, group_size) -> weight
TOOLS: Registry = Registry("tool")  # name -> agentrl.tools.Tool, filled by the @tool decorator
# engine.kind -> an EngineKind class (runtime/assembly/engine_kinds/; the plan makes one per run)
ENGINE_KINDS: Registry[type] = Registry("engine kind")


# The names users call: each registry's own `register`, a decorator when given only a name.
register_env = ENVS.register  # an env class/factory (env.type)
register_environment = ENVS.register  # AReaL's name for register_env (the seeds' register_environment("my-env", MyEnv))
register_agent = AGENTS.register  # an agent class/factory (agent.type)
register_estimator = ESTIMATORS.register  # an advantage estimator (algorithm.adv_estimator)
register_policy_loss = POLICY_LOSSES.register  # a policy loss (actor.policy_loss.loss_mode)
# A curriculum rule (rollout.curriculum.rule): `fn(estimate: float, seen: int, group_size: int) -> float`,
# a seen task's weight in the draws.
register_curriculum_rule = CURRICULUM_RULES.register
register_engine_kind = ENGINE_KINDS.register  # an engine kind: an EngineKind subclass (engine.kind)


# The modules that register the built-ins, listed once: the runtime, the env checker and the
# embedded model's cache key all load them through `load_builtins`.
BUILTIN_MODULES = ("agentrl.envs.frozen_lake", "agentrl.envs.sokoban", "agentrl.envs.math", "agentrl.envs.gem",
                   "agentrl.envs.minigrid",
                   "agentrl.envs.products", "agentrl.envs.multihop", "agentrl.envs.wait_walk",
                   "agentrl.envs.reasoning_gym", "agentrl.envs.textarena", "agentrl.envs.openenv",
                   "agentrl.envs.verifiers",
                   "agentrl.agents.chat", "agentrl.agents.math_retry",
                   "agentrl.agents.openai", "agentrl.agents.tool", "agentrl.algos.advantages",
                   "agentrl.algos.policy_losses", "agentrl.runtime.assembly.engine_kinds")


def load_builtins() -> None:
    """Register the built-in envs, agents, estimators and policy losses (imported on first call)."""
    import importlib

    for module in BUILTIN_MODULES:
        importlib.import_module(module)


# The modules `import_file` loaded: each process of a run imports them itself (Ray actors too).
FILE_MODULES: set[str] = set()


def import_file(path: Path) -> ModuleType:
    """The module of a .py file, imported once per process under its own name, the file's stem
    (`imports=[path/my_agent.py]` makes `my_agent:run` and `import my_agent` work); a name that
    another module holds, or that would shadow one on the import path, is refused."""
    path = path.expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no such file {path}")
    name = path.stem
    held = sys.modules.get(name)
    if held is not None:
        if _origin(getattr(held, "__file__", None)) == path:
            return held
        raise ImportError(f"{path} would be module '{name}', the name of {_shown(getattr(held, '__file__', None))}; "
                          "rename the file")
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        found = None
    if found is not None and _origin(found.origin) != path:
        raise ImportError(f"{path} would be module '{name}', the name of {_shown(found.origin)}; rename the file")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # only for a path no file loader handles; is_file() was checked
        raise ImportError(f"{path} cannot be imported as a Python file")
    sys.modules[name] = module = importlib.util.module_from_spec(spec)
    FILE_MODULES.add(name)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # a half-imported module must not be found next time
        FILE_MODULES.discard(name)
        raise
    return module


def _origin(file: str | None) -> Path | None:
    return Path(file).resolve() if file and file not in ("built-in", "frozen") else None


def _shown(origin: str | None) -> str:
    """Where a module comes from, for an error message."""
    return origin if origin and origin not in ("built-in", "frozen") else "a module of Python or an installed package"
