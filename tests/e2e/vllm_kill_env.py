"""FrozenLake that kills the run's vLLM server (SIGKILL to its whole session), as a crash would,
on the first reset after a chosen file appears (the engine's first weight push writes one):
imported by a run with `imports=[this file]`, the file named by AGENTRL_TEST_KILL_AFTER."""

import os
import signal
from pathlib import Path

import psutil

from agentrl.envs.frozen_lake import FrozenLakeEnv
from agentrl.registry import register_env

killed = False


class ServerKillingLake(FrozenLakeEnv):
    """FrozenLake whose first reset after AGENTRL_TEST_KILL_AFTER exists kills the vLLM servers this process started."""

    async def reset(self, seed=None, options=None):
        global killed
        if not killed and Path(os.environ["AGENTRL_TEST_KILL_AFTER"]).exists():
            killed = True
            for p in psutil.Process().children(recursive=True):
                try:
                    cmdline = " ".join(p.cmdline())
                except psutil.Error:  # a child that just ended
                    continue
                if "vllm.entrypoints.openai.api_server" in cmdline:
                    os.killpg(p.pid, signal.SIGKILL)  # the server leads its session: its engine and worker die too
        return await super().reset(seed=seed, options=options)


register_env("server_killing_lake", ServerKillingLake, overwrite=True)
