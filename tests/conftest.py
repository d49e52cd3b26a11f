"""Shared fixtures: a tiny tokenizer and model built locally (nothing downloaded), and the Ray
tests' cluster (one per test process)."""

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from agentrl.config import TinyModelConfig

CORPUS = [
    "user\nFrozenLake. Move P to G, avoid holes O.\nP _ _ _\n_ O _ O\n_ _ _ O\nO _ _ G",
    "assistant\n<answer>Left</answer> <answer>Right</answer> <answer>Up</answer> <answer>Down</answer>",
    "system\nYou are a helpful agent. What is 12 + 7? The answer is 19.",
] * 20


# Property tests draw the same examples on every run and machine (no example database either): a
# result may not depend on luck. A case one found once is pinned as a plain test beside it.
settings.register_profile("agentrl", derandomize=True, database=None)
settings.load_profile("agentrl")

# A shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored across
# exec: the runs the tests start would then never see the Ctrl-C they are sent. A handler of ours
# here is reset to the default in each child, so they behave as under a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# `make test` runs the suite on 2 workers (pytest-xdist, `--dist loadscope`): each module runs whole
# on one worker (its module fixtures are built once; a worker's Ray modules share one cluster, see
# `ray_nodes`), and modules are handed out in collection order. The longest modules, by their
# measured times, are collected first, so that none starts last and runs alone while the other
# worker idles. A module missing from this list only costs time; the order within a module is
# never changed.
LONGEST_FIRST = [  # by the modules' measured times (a clean clone's suite, 2 workers)
    "e2e/test_benchmarks.py", "runtime/test_ray_features.py", "runtime/test_ray_runtime.py",
    "runtime/test_ray_served.py", "e2e/test_run_folder.py", "llm/test_vllm_engine.py", "e2e/test_tool_tasks_train.py",
    "e2e/test_vllm_launch.py", "runtime/test_ray_async.py", "e2e/test_misbehaving_run.py",
    "runtime/test_ray_elastic.py", "runtime/test_ray_mcp.py", "runtime/test_ray_openenv.py", "e2e/test_faults.py",
    "e2e/test_openai_tools_train.py", "e2e/test_qwen_shape.py",
    "seeds/test_seed_style.py",
    "e2e/test_serve_train.py", "e2e/test_tool_train.py", "e2e/test_resume.py", "e2e/test_observe.py",
    "runtime/test_ray_cluster.py", "envs/test_fuzz.py", "e2e/test_train.py", "llm/test_vllm_nccl.py",
]


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the longest modules first (see LONGEST_FIRST); a plain run keeps its order."""
    if not hasattr(config, "workerinput"):  # set in an xdist worker only
        return
    rank = {str(Path(__file__).parent / name): i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))  # a stable sort


@pytest.fixture(scope="session")
def run_model_cache(tmp_path_factory, pytestconfig):
    """This test run's model cache folder: one for all its pytest-xdist workers (under their common
    base temp), so that a warm start two workers' modules need is computed once (the cache's writes
    are atomic, and a warm start is determined by its key). A test that reads or damages a cache on
    purpose, or needs an empty one, names a folder of its own."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if hasattr(pytestconfig, "workerinput") else base) / "agentrl_cache"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session", autouse=True)
def _own_model_cache(run_model_cache):
    """The model cache of a test that names none (model.cache_dir) is this test run's own (see
    run_model_cache), in this process and the ones it starts: no test reads what a user's
    ~/.cache/agentrl holds, or fills it."""
    before = os.environ.get("AGENTRL_CACHE")
    os.environ["AGENTRL_CACHE"] = str(run_model_cache)
    yield
    if before is None:
        os.environ.pop("AGENTRL_CACHE", None)
    else:
        os.environ["AGENTRL_CACHE"] = before


@pytest.fixture
def registries_restored():
    """Every registry of agentrl.registry as it was before the test: a test registers names of its
    own (an estimator, a loss, an engine kind) without leaving them to the tests after it."""
    from agentrl import registry

    tables = [t for t in vars(registry).values() if isinstance(t, registry.Registry)]
    saved = [dict(t._items) for t in tables]
    yield
    for table, items in zip(tables, saved):
        table._items.clear()
        table._items.update(items)


# What Ray's processes and drivers read: no token file in the home folder, session files in a
# short folder of the test run (Ray's socket paths must fit 107 bytes), not /tmp/ray.
RAY_ENV = ("RAY_AUTH_MODE", "RAY_TMPDIR")


@contextlib.contextmanager
def ray_env(temp: str):
    """RAY_ENV set for the Ray tests' own processes, as it was before once they are done: a module
    that starts a Ray of its own (a subprocess, a local cluster) never sees ours."""
    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_TMPDIR=temp)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class RayNodes:
    """A running two-node Ray cluster of this process (ray.cluster_utils.Cluster): its address,
    and `env()`, RAY_ENV as its processes were started with."""

    def __init__(self, temp: str) -> None:
        from ray.cluster_utils import Cluster

        self.temp = temp
        with self.env():
            self.nodes = Cluster(initialize_head=True,
                                 head_node_args={"num_cpus": 2, "num_gpus": 0, "include_dashboard": False})
            self.nodes.add_node(num_cpus=2, num_gpus=0)
        self.address = self.nodes.address

    def env(self):
        return ray_env(self.temp)

    def shutdown(self) -> None:
        with self.env():
            self.nodes.shutdown()


@pytest.fixture(scope="session")
def ray_nodes():
    """Two nodes of 2 logical CPUs each, no GPU (two raylets on this machine), started by the
    first module of this process that asks for them (tests/runtime/test_ray_runtime.py's
    `cluster`) and stopped at the end of the session. Starting them takes tens of seconds on a
    loaded machine: the Ray modules of a pytest-xdist worker share them, each as a Ray job of its
    own (see `cluster`)."""
    temp = tempfile.mkdtemp(prefix="agentrl-ray-")  # short: Ray's socket paths must fit 107 bytes
    os.makedirs(os.path.join(temp, "ray"))
    nodes = RayNodes(temp)
    try:
        yield nodes
    finally:
        nodes.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from agentrl.models.tiny import build_tokenizer

    return build_tokenizer(CORPUS, vocab_size=384)


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    from agentrl.models.tiny import build_model

    model = build_model(TinyModelConfig(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                                        num_attention_heads=4, num_key_value_heads=2), tiny_tokenizer, seed=0)
    return model.eval()


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
