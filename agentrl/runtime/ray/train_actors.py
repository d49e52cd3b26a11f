"""The learning side on Ray: trainer ranks, and the reference and critic as actors of their own.

Trainer rank 0 (`TrainerActor`) runs the unchanged `Trainer` loop. What the trainer holds is
what it holds in one process: an actor (here `ShardedActor`: rank 0's own `Actor` plus the
other ranks, which it drives), a rollout source (`RaySource`), and when used a reference and a
critic (`RemoteReference`, `RemoteCritic`: the same methods, run in their actors). The other
ranks (`TrainWorkerActor`) hold an `Actor` each and update on their share of each mini-batch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agentrl.config.runtime import RuntimeConfig
from agentrl.models.lora import apply_lora
from agentrl.runtime.assembly.envs import bind, import_user_modules
from agentrl.runtime.assembly.learners import build_critic, build_reference
from agentrl.runtime.assembly.plan_types import RunPlan
from agentrl.runtime.assembly.rollout import eval_baselines
from agentrl.runtime.process import seed_everything
from agentrl.runtime.ray.workers import (
    SharedSpec,
    SourceParts,
    free_address,
    load_model,
    node_id,
    role_device,
    setup_worker,
)
from agentrl.train.actor import Actor
from agentrl.train.batch import Batch
from agentrl.train.parallel import DataParallel, init_group, merge_stats
from agentrl.train.precision import MasterWeights
from agentrl.train.trainer import Trainer

if TYPE_CHECKING:
    from agentrl.runtime.ray.elastic import ElasticSpec


def with_lora(run_plan: RunPlan, model: torch.nn.Module) -> torch.nn.Module:
    """`model` wrapped with the run's LoRA adapters when model.lora.rank > 0 (the same draws as the
    local runtime's build_learners: its own seeded generator), else as it is."""
    lora = run_plan.model.lora
    return apply_lora(model, lora, run_plan.seed) if lora.enabled else model


def dist_backend(rt: RuntimeConfig) -> str:
    """NCCL for ranks on GPUs, gloo on CPU."""
    return "nccl" if rt.actor_train.device_mapping else "gloo"


class TrainRank:
    """One trainer rank's model and `Actor` (data-parallel once the group is joined)."""

    def __init__(self, shared: SharedSpec, rank: int) -> None:
        spec = shared.get()
        run_plan, role = spec.plan, spec.plan.runtime.actor_train
        setup_worker(run_plan.runtime.num_threads, spec.registrations)
        self.spec = spec
        import_user_modules(run_plan.imports)
        seed_everything(run_plan.seed)
        self.plan, self.rank, self.world_size = run_plan, rank, role.world_size
        self.model = with_lora(run_plan, load_model(spec.model, role))  # float32 master weights, as in one process
        self.actor = self._actor(None)

    def _actor(self, parallel: DataParallel | None) -> Actor:
        p = self.plan
        return Actor(self.model, p.actor, temperature=p.rollout.temperature, horizon=p.update_horizon,
                     packed=p.model.use_remove_padding, parallel=parallel)

    def dist_address(self) -> tuple[str, int]:
        """Where rank 0 hosts the group's store."""
        return free_address()

    def init_dist(self, host: str, port: int) -> int:
        """Join the trainer ranks' group and wrap the model in DDP (every rank at once)."""
        if self.world_size > 1:
            init_group(host, port, self.rank, self.world_size, dist_backend(self.plan.runtime),
                       self.plan.runtime.collective_timeout)
            self.actor = self._actor(DataParallel(self.model, self.rank, self.world_size))
        return self.rank

    def info(self) -> dict[str, Any]:
        """Where it runs."""
        return {"node": node_id(), "rank": self.rank, "device": str(role_device(self.plan.runtime.actor_train))}


class TrainWorkerActor(TrainRank):
    """Trainer rank k >= 1: updates on its share, driven by rank 0."""

    def update(self, batch: Batch, lr: float) -> dict[str, list[float]]:
        """This rank's share of an update at learning rate `lr`; its raw statistics."""
        for group in self.actor.optimizer.param_groups:
            group["lr"] = lr
        return self.actor.update_stats(batch)

    def load_state(self, weights: dict[str, torch.Tensor], optimizer_state: dict,
                   master: dict[int, torch.Tensor] | None = None) -> None:
        """Continue from a checkpoint (rank 0 read it)."""
        self.actor.load_state(weights, optimizer_state, master)

    def ping(self) -> bool:
        """Alive (answered from a second thread while an update runs)."""
        return True


class ShardedActor:
    """The trainer's `Learner` (train/learner.py) when there are several ranks: rank 0's `Actor`,
    whose update also runs on every other rank (each on its share), statistics merged. What is
    not an update is rank 0's alone: its model, optimizer and master copies are checkpointed."""

    def __init__(self, local: Actor, workers: list[Any]) -> None:
        self.local = local
        self.workers = workers
        self._lr = local.cfg.lr

    @property
    def model(self) -> torch.nn.Module:
        """Rank 0's model."""
        return self.local.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """Rank 0's optimizer."""
        return self.local.optimizer

    @property
    def master(self) -> MasterWeights:
        """Rank 0's float32 master copies (every rank holds the same)."""
        return self.local.master

    @property
    def device(self) -> torch.device:
        """Where rank 0's model lives."""
        return self.local.device

    @property
    def temperature(self) -> float:
        """The temperature rank 0 computes logprobs at."""
        return self.local.temperature

    def schedule(self, step: int, total: int) -> float:
        """Set the learning rate (every rank gets it with the next update)."""
        self._lr = self.local.schedule(step, total)
        return self._lr

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        """Rank 0's logprobs of the whole batch (a forward only)."""
        return self.local.compute_logprobs(batch)

    def update(self, batch: Batch) -> dict[str, float]:
        """Every rank's share of the update; the metrics one worker would report."""
        import ray

        ref = ray.put(batch)
        pending = [w.update.remote(ref, self._lr) for w in self.workers]
        mine = self.local.update_stats(batch)
        return merge_stats([mine, *ray.get(pending)])

    def engine_weights(self) -> dict[str, torch.Tensor]:
        """What the engines need: rank 0's weights (every rank holds the same)."""
        return self.local.engine_weights()

    def load_state(self, weights: dict[str, torch.Tensor], optimizer_state: dict,
                   master: dict[int, torch.Tensor] | None = None) -> None:
        """Every rank continues from the checkpoint."""
        import ray

        pending = [w.load_state.remote(weights, optimizer_state, master) for w in self.workers]
        self.local.load_state(weights, optimizer_state, master)
        ray.get(pending)


class ModelRoleActor:
    """The reference or the critic in an actor of its own."""

    def __init__(self, shared: SharedSpec, role: str) -> None:
        spec = shared.get()
        run_plan, section = spec.plan, getattr(spec.plan.runtime, role)
        setup_worker(run_plan.runtime.num_threads, spec.registrations)
        import_user_modules(run_plan.imports)
        policy = load_model(spec.model, section)
        # The reference is the starting model (the local run's policy with its adapters off); the
        # critic's body is the policy's, adapters included (train/critic.py), as locally.
        self.obj = build_reference(run_plan, policy) if role == "reference" else \
            build_critic(run_plan, with_lora(run_plan, policy), role_device(section))

    def call(self, method: str, *args: Any) -> Any:
        """obj.method(*args)."""
        return getattr(self.obj, method)(*args)

    def info(self) -> dict[str, Any]:
        """Where it runs."""
        return {"node": node_id()}


class RemoteReference:
    """The trainer's view of the reference actor."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        """The reference policy's logprobs, (B, T)."""
        import ray

        return ray.get(self.handle.call.remote("compute_logprobs", batch))


class RemoteCritic:
    """The trainer's view of the critic actor."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(self.handle.call.remote(method, *args))

    def compute_values(self, batch: Batch) -> torch.Tensor:
        """Values of every position, (B, T)."""
        return self._call("compute_values", batch)

    def update(self, batch: Batch) -> dict[str, float]:
        """The critic's update and its metrics."""
        return self._call("update", batch)

    def state_dict(self) -> dict:
        """Weights and optimizer state."""
        return self._call("state_dict")

    def load_state_dict(self, state: dict) -> None:
        """Restore weights and optimizer state."""
        self._call("load_state_dict", state)


class TrainerActor(TrainRank):
    """Trainer rank 0: the training loop, the run folder's writer, the source of weights."""

    def __init__(self, shared: SharedSpec) -> None:
        super().__init__(shared, 0)
        self.tokenizer = self.spec.tokenizer
        self.run_dir = Path(self.plan.run_dir)
        self._trainer: Trainer | None = None  # built by setup
        self.source: Any = None  # the trainer's rollout source: ray_source, or a stream over it
        self.ray_source: Any = None

    @property
    def trainer(self) -> Trainer:
        """The trainer `setup` built."""
        if self._trainer is None:
            raise RuntimeError("TrainerActor: setup() must run before the trainer is used")
        return self._trainer

    def setup(self, parts: SourceParts, workers: list[Any], reference: Any, critic: Any,
              elastic: ElasticSpec | None = None) -> int:
        """Build the trainer over the placed parts; returns the policy version the engines serve
        (`elastic`: to add and remove replicas as the run folder asks)."""
        from agentrl.runtime.ray.served import build_served
        from agentrl.runtime.ray.source import RaySource

        served = None  # engine.kind=remote / vllm: rank 0 drives the servers
        if parts.served is not None:
            served = build_served(self.plan, self.model, self.tokenizer, parts.served.replicas, parts.served.api_key)
        # What the engines serve: the adapter state with LoRA, else the full state dict.
        self.ray_source = RaySource(self.plan, weights=lambda: self.actor.engine_weights(), engines=parts.engines,
                                    engine_names=parts.engine_names, managers=parts.managers,
                                    transport=parts.transport, weights_dir=parts.weights_dir, served=served)
        self.source = self.ray_source
        if elastic is not None:
            from agentrl.runtime.ray.elastic import ElasticEngines

            self.ray_source.elastic = ElasticEngines(elastic, self.ray_source,
                                                     log=lambda message: print(message, file=sys.stderr, flush=True))
        if self.plan.max_staleness:  # groups played ahead: the local stream over the actors
            from agentrl.runtime.ray.stream import ray_stream_source

            self.source = ray_stream_source(self.ray_source, self.plan.max_staleness, self.plan.rollout.episode_timeout,
                                            accept_stale=self.plan.rollout.stale_samples == "correct")
        actor = ShardedActor(self.actor, workers) if workers else self.actor
        self._trainer = Trainer(self.spec.cfg, actor, self.source, self.tokenizer, self.run_dir,
                                eval_baselines=eval_baselines(bind(self.plan).factories),
                                reference=RemoteReference(reference) if reference is not None else None,
                                critic=RemoteCritic(critic) if critic is not None else None)
        self._trainer.log = lambda message: print(message, file=sys.stderr, flush=True)
        return self._trainer.version

    def weight_group_address(self) -> tuple[str, int]:
        """Where rank 0 hosts the weight broadcast group's store."""
        return free_address()

    def join_weight_group(self, host: str, port: int, world_size: int, backend: str) -> str:
        """Join the broadcast group with the engines, as its rank 0."""
        from agentrl.runtime.ray.weight_sync import BroadcastTransport, make_transport

        transport = make_transport(backend)
        assert isinstance(transport, BroadcastTransport)  # the driver joins a group only for nccl
        transport.join(host, port, 0, world_size, self.plan.runtime.collective_timeout, self.actor.device)
        self.ray_source.use_transport(transport)
        return backend

    def restore(self) -> int:
        """Continue from the run folder's newest readable checkpoint; returns its step."""
        self.trainer.resume()
        return self.trainer.step_idx

    def step(self) -> int:
        """The last step trained."""
        return self.trainer.step_idx

    def fit(self, resume: bool) -> dict[str, Any]:
        """Train to trainer.total_steps; the run's summary."""
        return self.trainer.fit(resume=resume)

    def evaluate(self) -> dict[str, float]:
        """Greedy episodes on held-out env seeds: the eval/ metrics."""
        return self.trainer.evaluate()
