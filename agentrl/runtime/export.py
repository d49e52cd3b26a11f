"""`agentrl export RUN_DIR`: a run's newest checkpoint as a standalone Hugging Face model folder.

A full fine-tuning checkpoint already is one (it is copied with its tokenizer); a LoRA
checkpoint holds only the adapter, so the run's base model (model.path, or the cached embedded
default) is loaded and the adapter is merged into its weights (peft's merge_and_unload). The
folder loads with `AutoModelForCausalLM.from_pretrained` alone, and `model.path=<folder>` starts
a new run from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from agentrl.config import load_config
from agentrl.errors import CheckpointError, ConfigError
from agentrl.models.loading import load_pretrained, save_pretrained
from agentrl.models.lora import is_adapter_folder, merged
from agentrl.train.checkpoint_hold import held_newest


def export_run(run_dir: Path, out: Path | None = None, overrides: Sequence[str] = (),
               log: Callable[[str], None] = print) -> tuple[Path, Path]:
    """Write the newest readable checkpoint of `run_dir` as a model folder (LoRA merged) at `out`
    (default RUN_DIR/export); returns (checkpoint, folder written)."""
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} is not a run folder (no config.yaml); give the folder a run wrote")
    out = out or run_dir / "export"
    for p in [out, *out.parents]:  # the nearest existing folder of out: a file there ends the export now
        if p.exists():
            if not p.is_dir():
                raise ConfigError(f"--out {out}: {p} is a file; give a new or empty folder")
            break
    if out.exists() and any(out.iterdir()) and not (out / "config.json").is_file():
        # save_pretrained replaces the folder: never let that delete something that is not a model
        raise ConfigError(f"--out {out} exists and is not a model folder; choose a new or empty folder")
    cfg = load_config(run_dir / "config.yaml", list(overrides))
    # Held while it is read: a trainer still writing the run may prune it meanwhile.
    with held_newest(run_dir / "checkpoints", warn=log) as found:
        if found is None:
            raise CheckpointError(f"no checkpoint in {run_dir / 'checkpoints'}; train first or check the folder")
        ckpt, held, _ = found
        if is_adapter_folder(held):
            from agentrl.runtime.assembly.plan import plan
            from agentrl.runtime.assembly.policy import build_policy  # the run's base model, as training built it

            base, tokenizer = build_policy(plan(cfg), log)
            model = merged(base, held)
        else:
            model, tokenizer = load_pretrained(held, cfg.model.dtype)
    try:
        return ckpt, save_pretrained(model, tokenizer, out)
    except OSError as e:  # a read-only folder, a full disk: nothing half-written is left as out
        raise ConfigError(f"--out {out}: cannot write the model there ({e.strerror or e})") from None
