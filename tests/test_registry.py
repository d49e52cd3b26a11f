"""The registries' one way to register: `REGISTRY.register(name, item)` or, given only a name, as a
decorator; the documented names (`register_env`, `register_environment`, `register_agent`,
`register_estimator`, `register_policy_loss`, `register_curriculum_rule`) do the same."""

import pytest

from agentrl import registry
from agentrl.errors import RegistryError
from agentrl.registry import Registry


def test_register_takes_an_item_or_decorates():
    table: Registry = Registry("thing")

    @table.register("decorated")
    def made() -> int:
        return 1

    assert made() == 1 and table.get("decorated") is made  # the decorator returns what it decorates
    assert table.register("direct", len) is len and table.get("direct") is len
    assert table.names() == ["decorated", "direct"]


def test_a_name_taken_by_another_item_is_refused_unless_overwrite():
    table: Registry = Registry("thing")
    table.register("x", len)
    table.register("x", len)  # the same item again: no error
    with pytest.raises(RegistryError, match="thing 'x' is already registered"):
        table.register("x")(abs)
    table.register("x", abs, overwrite=True)
    assert table.get("x") is abs
    with pytest.raises(RegistryError, match="non-empty string"):
        table.register("", abs)


@pytest.mark.parametrize("public, table", [
    ("register_env", "ENVS"), ("register_environment", "ENVS"), ("register_agent", "AGENTS"),
    ("register_estimator", "ESTIMATORS"), ("register_policy_loss", "POLICY_LOSSES"),
    ("register_curriculum_rule", "CURRICULUM_RULES")])
def test_the_documented_names_register_in_their_registry(public, table, registries_restored):
    register, target = getattr(registry, public), getattr(registry, table)
    name = f"test_registry_{public}"

    @register(name)
    def item() -> None: ...

    assert target.get(name) is item
    assert register(name, item) is item  # the direct form, the same item again
    with pytest.raises(RegistryError, match="already registered"):
        register(name, len)
    assert register(name, len, overwrite=True) is len and target.get(name) is len
