"""Misbehaving envs through `check_env`: each broken contract is an EnvCheckError naming the field."""

import pytest

from agentrl.envs.checker import EnvCheckError, check_env
from bad_envs import ESCAPES, FAULTS, BadLake  # tests/ is on sys.path (conftest.py)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_check_env_names_the_broken_field(fault):
    with pytest.raises(EnvCheckError) as err:
        check_env(lambda: BadLake(fault=fault))
    message = str(err.value)
    assert message.startswith("check_env(BadLake): ") and FAULTS[fault][1] in message, message
    assert "\n" not in message


def test_a_close_that_always_raises_is_a_check_failure_not_a_traceback():
    with pytest.raises(EnvCheckError, match=r"close: close\(\) raised RuntimeError: the lake will not close"):
        check_env(lambda: BadLake(close_raises=True))


def test_a_constructor_or_sample_action_that_raises_is_a_check_failure():
    def broken():
        raise OSError("no map file")

    with pytest.raises(EnvCheckError, match=r"check_env\(env\): build: make_env\(\) raised OSError: no map file"):
        check_env(broken)

    class NoSample(BadLake):
        def sample_action(self, rng):
            raise KeyError("state")

    with pytest.raises(EnvCheckError, match=r"sample_action: raised KeyError"):
        check_env(NoSample)


def test_the_well_behaved_lake_passes():
    check_env(lambda: BadLake())
    check_env(lambda: BadLake(fault="nan_reward", every=10**9), seeds=(1, 2))  # faulty only on seed 0


@pytest.mark.parametrize("fault", ["sys_exit", "base_exception"])
def test_an_env_that_exits_or_raises_a_base_exception_is_a_check_failure_not_an_exit(fault):
    with pytest.raises(EnvCheckError) as err:
        check_env(lambda: BadLake(fault=fault))
    message = str(err.value)
    assert message.startswith("check_env(BadLake): step: ") and ESCAPES[fault][1].split(" in step")[0] in message
