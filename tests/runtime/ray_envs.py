"""Envs for the Ray runtime's tests (importable by Ray workers: tests/runtime is on their path).

`CoinEnv` pays by the parity of the reply's length, so a group's rewards differ and an update
moves the weights. `kills={what: at}` makes either env kill parts of the Ray run (see Saboteur);
`scales=[[at, n], ...]` makes it run `agentrl scale RUN_DIR engines=n` (elastic rollout).
"""

import os
import threading
import uuid
from pathlib import Path

from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.registry import register_env
from agentrl.rollout.tasks import EVAL_SEED_BASE


def named_actor(suffix: str):
    """The live actor of the run whose name ends with `suffix`."""
    import ray

    names = [n["name"] if isinstance(n, dict) else n for n in ray.util.list_named_actors()]
    (name,) = [n for n in names if n.endswith(suffix)]
    return ray.get_actor(name)


class Saboteur:
    """Counts training env steps (a file each under `marker`, so that every process and restart
    counts) and kills each part of `kills` ({what: at}) once, at the first step numbered `at` or
    later: `env_manager` exits its own process; `engine` (replica 0) and `trainer_rank` (rank 1)
    are killed by name. `scales` ([at, n] pairs) asks the run in `run_dir` for n engine replicas
    through the CLI, once each, at the first step numbered `at` or later: the request is written
    during that training step, so the run applies it at the next one."""

    def __init__(self, marker: str, kills: dict, scales: list | None = None, run_dir: str = "") -> None:
        self.marker, self.kills = Path(marker) if marker else None, dict(kills or {})
        self.scales, self.run_dir = [tuple(s) for s in scales or []], run_dir

    def on_step(self, seed) -> None:
        if not (self.kills or self.scales) or seed is None or seed >= EVAL_SEED_BASE:
            return
        (self.marker / f"step-{uuid.uuid4().hex}").touch()
        n = sum(1 for p in self.marker.iterdir() if p.name.startswith("step-"))
        for what, at in self.kills.items():
            if n >= at and self._first(what):
                self._kill(what)
        for at, engines in self.scales:
            if n >= at and self._first(f"scale_{at}"):
                from agentrl import cli

                assert cli.main(["scale", self.run_dir, f"engines={engines}"]) == 0

    def _first(self, what: str) -> bool:
        try:  # O_EXCL: exactly one process, once, whatever runs concurrently or restarts
            os.close(os.open(self.marker / f"killed_{what}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def _kill(self, what: str) -> None:
        if what == "env_manager":
            os._exit(1)
        import ray

        target = named_actor({"engine": "-engine-0", "trainer_rank": "-actor_train-1"}[what])
        # A moment later, from another thread: the episodes' next requests are usually in flight
        # when it dies (the test asserts nothing that depends on it).
        threading.Timer(0.02, ray.kill, args=(target,), kwargs={"no_restart": False}).start()


class CoinEnv:
    """One turn; reward 1 when the reply has an odd number of characters, else 0."""

    instructions = "Reply with anything."

    def __init__(self, marker: str = "", kills: dict | None = None, scales: list | None = None,
                 run_dir: str = "") -> None:
        self.saboteur, self.seed = Saboteur(marker, kills, scales, run_dir), None

    async def reset(self, seed=None, options=None):
        self.seed = seed
        return "Toss a coin.", {}

    async def step(self, action: str):
        self.saboteur.on_step(self.seed)
        reward = float(len(action) % 2)
        return "Done.", reward, True, False, {"success": bool(reward)}

    def sample_action(self, rng) -> str:
        return rng.choice(["heads", "tails", "edge"])

    def close(self) -> None:
        pass


class SabotagedLake:
    """FrozenLake with a Saboteur."""

    def __init__(self, marker: str = "", kills: dict | None = None, **lake) -> None:
        self.lake, self.saboteur, self.seed = FrozenLakeEnv(**lake), Saboteur(marker, kills), None
        self.instructions = self.lake.instructions

    async def reset(self, seed=None, options=None):
        self.seed = seed
        return await self.lake.reset(seed=seed, options=options)

    async def step(self, action: str):
        self.saboteur.on_step(self.seed)
        return await self.lake.step(action)

    def sample_action(self, rng):
        return self.lake.sample_action(rng)

    def close(self) -> None:
        self.lake.close()


register_env("coin", CoinEnv, overwrite=True)
register_env("sabotaged_lake", SabotagedLake, overwrite=True)
