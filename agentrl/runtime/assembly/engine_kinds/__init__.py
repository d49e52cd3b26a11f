"""The engine kinds (engine.kind): one object each, one file each, registered by name in
`agentrl.registry.ENGINE_KINDS`; `engine_kind(name)` resolves a name once, for the plan.

A new kind subclasses `EngineKind` (runtime/assembly/plan_types.py), or a built-in kind, and is
registered from a module of `imports` (docs/extending.md, "A new engine kind")."""

from __future__ import annotations

from agentrl.config.checks import check_engine_kind_name
from agentrl.registry import ENGINE_KINDS
from agentrl.runtime.assembly.engine_kinds.local import LocalKind
from agentrl.runtime.assembly.engine_kinds.remote import RemoteKind
from agentrl.runtime.assembly.engine_kinds.vllm import VllmKind
from agentrl.runtime.assembly.plan_types import EngineKind

__all__ = ["EngineKind", "LocalKind", "RemoteKind", "VllmKind", "engine_kind"]

ENGINE_KINDS.register("local", LocalKind)
ENGINE_KINDS.register("remote", RemoteKind)
ENGINE_KINDS.register("vllm", VllmKind)


def engine_kind(name: str) -> EngineKind:
    """The object of engine kind `name`; an unknown one fails in one line naming engine.kind and
    the registered kinds."""
    check_engine_kind_name(name)
    kind: EngineKind = ENGINE_KINDS.get(name)()
    return kind
