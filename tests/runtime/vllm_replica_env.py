"""FrozenLake that kills the vLLM server of a Ray run's engine replica (SIGKILL to its whole session),
as a crash would, on the first reset after a chosen file appears (the first weight push writes one).
An env manager imports it (`imports=[this file]`); `env.args`: `kill_after` (that file) and `model`
(the run's model folder: only a server started on it is killed, never another run's)."""

import os
import signal
from pathlib import Path

import psutil

from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.registry import register_env


class ReplicaKillingLake(FrozenLakeEnv):
    """FrozenLake whose first reset after `kill_after` exists kills the run's vLLM servers, once."""

    def __init__(self, kill_after: str = "", model: str = "", **kwargs):
        super().__init__(**kwargs)
        self.kill_after, self.model = Path(kill_after), model

    async def reset(self, seed=None, options=None):
        if self.kill_after.exists() and self._first():
            for p in psutil.process_iter():
                try:
                    cmdline = p.cmdline()
                except psutil.Error:  # ended meanwhile, or not ours to read
                    continue
                if "vllm.entrypoints.openai.api_server" in cmdline and any(self.model in a for a in cmdline):
                    os.killpg(p.pid, signal.SIGKILL)  # the server leads its session: its engine and worker die too
        return await super().reset(seed=seed, options=options)

    def _first(self) -> bool:
        try:  # O_EXCL: one kill, whatever process plays the episode
            os.close(os.open(self.kill_after.parent.parent / "killed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


register_env("replica_killing_lake", ReplicaKillingLake, overwrite=True)
