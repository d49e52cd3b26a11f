"""Command line: `agentrl train | eval`.

    agentrl train                                     # the embedded default (4x4 FrozenLake)
    agentrl train configs/frozen_lake.yaml trainer.total_steps=20 seed=3
    agentrl train --config-path configs --config-name frozen_lake_random
    agentrl resume runs/frozen_lake                   # continue a killed run from its last checkpoint
    agentrl eval runs/frozen_lake                     # evaluate the run's latest checkpoint
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from agentrl.errors import AgentRLError


def _fields_help() -> str:
    from agentrl.config import field_docs

    lines = ["config fields (set with key=value):"]
    for key, default, doc in field_docs():
        lines.append(f"  {key} = {default}")
        lines.extend(textwrap.wrap(doc, 88, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentrl", description="RL for multi-turn language-model agents.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train an agent", epilog=_fields_help(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("args", nargs="*", help="an optional YAML config file, then key=value overrides")
    t.add_argument("--config-path", help="folder of YAML configs (Hydra style)")
    t.add_argument("--config-name", help="config file name in --config-path, without .yaml")
    t.add_argument("--resume", action="store_true", help="continue from the run folder's latest checkpoint")
    r = sub.add_parser("resume", help="continue a run from its latest checkpoint")
    r.add_argument("run_dir")
    r.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.total_steps=100")
    e = sub.add_parser("eval", help="evaluate a run's latest checkpoint")
    e.add_argument("run_dir")
    e.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.eval_episodes=64")
    return p


def _split_config(args: list[str], config_path: str | None, config_name: str | None):
    path = None
    if args and "=" not in args[0]:
        path, args = args[0], args[1:]
    if config_name:
        if path:
            raise AgentRLError("give either a config file or --config-name, not both")
        name = config_name if config_name.endswith((".yaml", ".yml")) else config_name + ".yaml"
        path = str(Path(config_path or ".") / name)
    elif config_path:
        raise AgentRLError("--config-path needs --config-name")
    bad = [a for a in args if "=" not in a]
    if bad:
        raise AgentRLError(f"expected key=value overrides after the config file, got '{bad[0]}'")
    return path, args


def cmd_train(ns: argparse.Namespace) -> int:
    """`agentrl train`."""
    from agentrl.config import load_config

    path, overrides = _split_config(ns.args, ns.config_path, ns.config_name)
    resume = ns.resume
    if "resume=true" in overrides:  # also accepted as an override, as in the seeds' launchers
        overrides.remove("resume=true")
        resume = True
    cfg = load_config(path, overrides)
    from agentrl.metrics import summary_table
    from agentrl.runtime.local import train

    summary = train(cfg, resume=resume, log=lambda m: print(m, file=sys.stderr))
    print(summary_table(summary))
    print(f"run folder: {cfg.resolved_run_dir()}")
    return 0


def cmd_resume(ns: argparse.Namespace) -> int:
    """`agentrl resume RUN_DIR`: the run's own config, continued from its latest checkpoint."""
    from agentrl.config import load_config
    from agentrl.metrics import summary_table
    from agentrl.runtime.local import train

    run_dir = Path(ns.run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise AgentRLError(f"{run_dir} is not a run folder (no config.yaml); give the folder a run wrote")
    cfg = load_config(run_dir / "config.yaml", [*ns.overrides, f"run_dir={run_dir}"])
    summary = train(cfg, resume=True, log=lambda m: print(m, file=sys.stderr))
    print(summary_table(summary))
    print(f"run folder: {run_dir}")
    return 0


def cmd_eval(ns: argparse.Namespace) -> int:
    """`agentrl eval RUN_DIR`."""
    from agentrl.config import load_config
    from agentrl.metrics import summary_table
    from agentrl.runtime.local import build_trainer
    from agentrl.train.checkpoint import latest_checkpoint

    run_dir = Path(ns.run_dir)
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    if ckpt is None:
        raise AgentRLError(f"no checkpoint in {run_dir / 'checkpoints'}; train first or check the folder")
    cfg = load_config(run_dir / "config.yaml", [*ns.overrides, f"model.path={ckpt}"])
    trainer = build_trainer(cfg, run_dir, log=lambda m: print(m, file=sys.stderr))
    metrics = trainer.evaluate()
    print(summary_table({"checkpoint": ckpt.name, **metrics}))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `agentrl` console script."""
    ns = _parser().parse_args(argv)
    try:
        return {"train": cmd_train, "resume": cmd_resume, "eval": cmd_eval}[ns.command](ns)
    except AgentRLError as e:
        print(f"agentrl: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("agentrl: interrupted; resume with --resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
