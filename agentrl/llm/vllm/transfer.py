"""Our weight transport, inside vLLM's worker process: weights travel as a safetensors file.

vLLM's RL API moves weights in four calls (`/init_weight_transfer_engine`,
`/start_weight_update`, `/update_weights`, `/finish_weight_update`) through a registered
`WeightTransferEngine`; the built-in ones need CUDA (NCCL, CUDA IPC). This one needs none:
`/update_weights` names a safetensors file the trainer wrote (on tmpfs it never touches a disk)
and the worker loads it with vLLM's layerwise reload, exactly as the IPC engine loads tensors
(checkpoint names in, fused and repacked kernel weights out).

How vLLM gets it: the server starts with `--worker-extension-cls
agentrl.llm.vllm.transfer.WorkerExtension` and `--weight-transfer-config '{"backend":
"agentrl_file"}'`, with agentrl's package on the worker's PYTHONPATH (launch.py does all three).
vLLM imports the extension class before it builds the worker, and importing this module
registers the backend, so it exists when the worker's `load_model` creates the engine. No
entry point or plugin install is needed in vLLM's environment.

The file must lie in the folder named by AGENTRL_VLLM_WEIGHTS_DIR in the server's environment
(a path outside it is refused unread), and be no larger than weights of the served model can be.

Imports: torch, safetensors, vLLM and agentrl.llm.weights only (vLLM's environment has no
other agentrl dependency).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from agentrl.llm.weights import from_weights_dir

BACKEND = "agentrl_file"  # the name in --weight-transfer-config
WEIGHTS_DIR_ENV = "AGENTRL_VLLM_WEIGHTS_DIR"


@dataclass
class FileInitInfo(WeightTransferInitInfo):
    """Nothing to set up: no process group, no handles."""


@dataclass
class FileUpdateInfo(WeightTransferUpdateInfo):
    """One update: a safetensors file of checkpoint-named tensors in AGENTRL_VLLM_WEIGHTS_DIR."""

    path: str


class FileWeightTransferEngine(WeightTransferEngine[FileInitInfo, FileUpdateInfo]):
    """Loads weights from a safetensors file the trainer wrote, with vLLM's layerwise reload."""

    init_info_cls = FileInitInfo
    update_info_cls = FileUpdateInfo

    def init_transfer_engine(self, init_info: FileInitInfo) -> None:
        """Nothing to rendezvous with."""

    def start_weight_update(self) -> None:
        """Put the model in layerwise-reload mode (weights arrive in checkpoint format)."""
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict) -> None:
        """Load one file. Overridden because the base class ends with torch.accelerator.synchronize(),
        which raises where there is no accelerator (loading from a file is synchronous anyway), and
        because a failed load must not leave the model mid-reload: vLLM's worker ends the update
        session on an error without finalizing, and the next forward pass then meets meta tensors
        and kills the engine. Finalizing puts back the kernel weights of every layer nothing was
        loaded into, so a refused or unreadable file leaves the old weights serving."""
        try:
            self.receive_weights(self.parse_update_info(update_info))
        except BaseException:
            self.finish_weight_update()
            raise

    def receive_weights(self, update_info: FileUpdateInfo) -> None:
        """Read the file (inside the weights folder only) and hand its tensors to the model's loader."""
        folder = os.environ.get(WEIGHTS_DIR_ENV)
        if not folder:
            raise ValueError(f"this vLLM server was started without {WEIGHTS_DIR_ENV}: it reads weights from no folder")
        tensors = from_weights_dir(update_info.path, folder, self._limit())
        self.model.load_weights(iter(tensors.items()))

    def finish_weight_update(self) -> None:
        """Process the loaded weights into kernel format (fusing, repacking for the CPU kernels)."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        """Nothing held between updates."""

    def _limit(self) -> int:
        """The most bytes a weights file may hold: the served checkpoint's safetensors twice over
        (float32 pushed to a bfloat16 server) plus headers; unbounded for a model not on disk."""
        folder = Path(str(self.model_config.model))
        files = list(folder.glob("*.safetensors")) if folder.is_dir() else []
        return 2 * sum(f.stat().st_size for f in files) + (1 << 20) if files else 1 << 62


class WorkerExtension:
    """Mixed into vLLM's worker by `--worker-extension-cls`; importing it registered the transport."""

    def agentrl_transfer_backend(self) -> str:
        """The weight transport the worker was started with (a `/collective_rpc` call that tells a
        client the extension is loaded, and which transport to drive)."""
        config = getattr(self, "vllm_config", None)  # the worker's, which this class is mixed into
        transfer = getattr(config, "weight_transfer_config", None)
        return getattr(transfer, "backend", None) or BACKEND


def register() -> None:
    """Register the transport with vLLM's factory (once per process: vLLM refuses a second)."""
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, FileWeightTransferEngine)


register()
