"""The runtime section's checks without a cluster (config/checks.py), and placement against a
cluster's resources as Ray reports them (runtime/ray/placement.py): pure functions, no Ray."""

import pytest

from agentrl.config import load_config
from agentrl.config.runtime import placement_summary
from agentrl.errors import ConfigError
from agentrl.runtime.ray.placement import HEAD, check_resources, choose_transport, plan_placement

RAY = ["runtime.kind=ray"]


def _cfg(*overrides):
    return load_config("configs/frozen_lake.yaml", list(overrides))


@pytest.mark.parametrize("overrides, message", [
    (["runtime.env_managers=2"], "runtime.env_managers is set but runtime.kind=local"),
    ([*RAY, "runtime.env_managers=5"], "at most 4 env managers get work"),
    ([*RAY, "runtime.actor_infer.device_mapping=[0,0]"], "names a GPU twice"),
    ([*RAY, "runtime.actor_infer.world_size=3", "runtime.actor_infer.device_mapping=[0,1]"], "give one GPU per worker"),
    ([*RAY, "runtime.actor_train.world_size=32"], "actor.ppo_mini_batch_size=16 has fewer rows"),
    ([*RAY, "device=cuda"], "set runtime.actor_train.device_mapping"),
    ([*RAY, "runtime.weight_sync=nccl", "runtime.actor_train.device_mapping=[0]",
      "runtime.actor_infer.device_mapping=[0]"], "NCCL cannot broadcast between processes on one GPU"),
    ([*RAY, "runtime.reference.world_size=2"], "the reference runs as one actor"),
    ([*RAY, "runtime.placement_timeout=0"], "runtime.placement_timeout=0.0 must be > 0"),
    ([*RAY, "runtime.kind=slurm"], "runtime.kind"),
    ([*RAY, "runtime.engine_transport=grpc"], "runtime.engine_transport"),
    (["runtime.engine_transport=http"], "runtime.engine_transport is set but runtime.kind=local"),
    ([*RAY, "engine.kind=remote", "engine.urls=[http://127.0.0.1:9]", "runtime.actor_infer.num_cpus=2"],
     "runtime.actor_infer is set but engine.kind=remote generates on engine.urls"),
    ([*RAY, "engine.kind=remote", "engine.urls=[http://127.0.0.1:9]", "runtime.weight_sync=shm"],
     "runtime.weight_sync=shm with engine.kind=remote: weights reach the servers over HTTP"),
    ([*RAY, "engine.kind=remote", "engine.urls=[http://127.0.0.1:9]", "engine.protocol=vllm",
      "engine.weights_dir=/w", "model.lora.rank=8"],
     "model.lora.rank=8 with engine.kind=remote needs engine.protocol=agentrl"),
    (["engine.kind=remote", "engine.urls=[http://127.0.0.1:9]", "engine.protocol=sglang", "engine.weights_dir=/w",
      "model.lora.rank=8"], "model.lora.rank=8 with engine.kind=remote needs engine.protocol=agentrl"),
    ([*RAY, "engine.kind=vllm", "engine.vllm.replicas=2"], "set runtime.actor_infer.world_size=2 instead"),
    ([*RAY, "engine.kind=vllm", "rollout.max_staleness=1"],
     "rollout.max_staleness=1 with engine.kind=vllm and runtime.kind=ray: asynchronous rollout on Ray's own vLLM "
     "replicas is not built yet"),
    ([*RAY, "engine.kind=vllm", "engine.vllm.weight_transfer=nccl"],
     "engine.vllm.weight_transfer=nccl broadcasts from trainer rank 0's GPU into the vLLM servers' GPUs"),
])
def test_a_bad_runtime_section_fails_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        _cfg(*overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_device_mapping_gives_the_world_size():
    cfg = _cfg(*RAY, "runtime.actor_infer.device_mapping=[2,3]")
    assert cfg.runtime.actor_infer.world_size == 2


def test_overlapping_mappings_colocate_roles_on_shared_gpus():
    cfg = _cfg(*RAY, "runtime.actor_train.device_mapping=[0,1]", "runtime.actor_infer.device_mapping=[1,2]",
               "runtime.env_managers=2", "runtime.env_manager_num_cpus=0.5")
    plan = plan_placement(cfg.runtime, reference=False, critic=False)
    gpu1 = [w for w in plan.workers if w.gpu == 1]
    assert sorted(w.role for w in gpu1) == ["actor_infer", "actor_train"]
    assert {w.bundle for w in gpu1} == {1} and all(w.gpu_share == 0.5 for w in gpu1)
    assert plan.bundles[1] == {"GPU": 1.0, "CPU": 2.0}
    assert plan.bundles[0][HEAD] > 0  # trainer rank 0 (GPU 0) writes the run folder on the head node
    assert [b for b in plan.bundles if "GPU" not in b] == [{"CPU": 0.5}, {"CPU": 0.5}]


def test_cpu_roles_that_reserve_nothing_get_no_bundle_but_rank_0_is_pinned():
    cfg = _cfg(*RAY, "runtime.actor_train.num_cpus=0", "runtime.actor_infer.num_cpus=0")
    plan = plan_placement(cfg.runtime, reference=True, critic=True)
    assert plan.bundles == [{HEAD: 0.001}]
    assert [w.role for w in plan.workers] == ["actor_train", "actor_infer", "reference", "critic", "env_manager"]


ONE_NODE = [{"CPU": 2.0, HEAD: 1.0, "memory": 1e9}]


@pytest.mark.parametrize("overrides, message", [
    (["runtime.actor_infer.device_mapping=[0,1]"],
     "runtime.actor_infer.device_mapping=[0, 1] needs GPU 1, but the cluster has no GPU; leave device_mapping empty"),
    (["runtime.actor_train.world_size=3"], "the run needs 4 CPUs (actor_train 3 x 1 CPU, actor_infer 1 x 1 CPU"),
    (["runtime.actor_infer.num_cpus=3"], "the run needs 4 CPUs"),
])
def test_an_impossible_placement_names_what_is_missing(overrides, message):
    cfg = _cfg(*RAY, *overrides)
    plan = plan_placement(cfg.runtime, reference=False, critic=False)
    with pytest.raises(ConfigError) as e:
        check_resources(plan, cfg.runtime, {"CPU": 2.0}, ONE_NODE)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_bundle_no_single_node_can_hold_is_refused():
    cfg = _cfg(*RAY, "runtime.actor_infer.num_cpus=3")
    nodes = [{"CPU": 2.0, HEAD: 1.0}, {"CPU": 2.0}]
    with pytest.raises(ConfigError, match=r"no node of the cluster can hold \{'CPU': 3.0\}"):
        check_resources(plan_placement(cfg.runtime, False, False), cfg.runtime, {"CPU": 4.0}, nodes)
    check_resources(plan_placement(_cfg(*RAY).runtime, False, False), _cfg(*RAY).runtime, {"CPU": 4.0}, nodes)  # fits


def test_the_transport_follows_placement():
    cfg = _cfg(*RAY)
    here, there = {"node": "a"}, {"node": "b"}
    assert choose_transport(cfg.runtime.weight_sync, here, [here, here]) == "shm"
    assert choose_transport(cfg.runtime.weight_sync, here, [here, there]) == "object_store"
    assert choose_transport(cfg.runtime.weight_sync, {"node": "a", "gpu": 0}, [{"node": "a", "gpu": 1}]) == "nccl"
    assert choose_transport(cfg.runtime.weight_sync, {"node": "a", "gpu": 0}, [{"node": "a", "gpu": 0}]) == "shm"  # colocated
    assert choose_transport("file", here, [there]) == "file"
    with pytest.raises(ConfigError, match="weight_sync=shm needs every engine on trainer rank 0's node"):
        choose_transport("shm", here, [there])


def test_a_run_on_engine_urls_places_no_engine_replica_and_says_so():
    from agentrl.runtime.assembly.engine_kinds import engine_kind

    cfg = _cfg(*RAY, "engine.kind=remote", "engine.urls=[http://127.0.0.1:9]", "runtime.env_managers=2")
    remote = engine_kind("remote")
    plan = plan_placement(cfg.runtime, reference=False, critic=False, engines=not remote.attached(cfg.engine))
    assert [w.role for w in plan.workers] == ["actor_train", "env_manager", "env_manager"]
    assert "actor_infer none (the servers of engine.urls)" in placement_summary(cfg.runtime, remote.served, True)
    assert placement_summary(cfg.runtime, remote.served, True).endswith("reaching the engines by http")
    vllm = _cfg(*RAY, "engine.kind=vllm", "runtime.actor_infer.world_size=2")
    workers = plan_placement(vllm.runtime, False, False, not engine_kind("vllm").attached(vllm.engine)).workers
    assert [w.role for w in workers].count("actor_infer") == 2
