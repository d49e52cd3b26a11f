"""Command line: `agentrl train | plan | resume | eval | serve | view | export | scale`.

    agentrl train                                     # the embedded default (4x4 FrozenLake)
    agentrl train configs/frozen_lake.yaml trainer.total_steps=20 seed=3
    agentrl train --config-path configs --config-name frozen_lake_random
    agentrl plan configs/mixed.yaml [--json]          # what a run of this config is made of; builds nothing
    agentrl resume runs/frozen_lake                   # continue a killed run from its last checkpoint
    agentrl eval runs/frozen_lake                     # evaluate the run's latest checkpoint
    agentrl serve configs/frozen_lake.yaml serve.port=8000   # the policy over HTTP (OpenAI routes)
    agentrl view runs/frozen_lake [--serve]           # the trajectory viewer page of a run
    agentrl export runs/frozen_lake                   # the latest checkpoint as a model folder (LoRA merged)
    agentrl scale runs/frozen_lake engines=3          # a running Ray run: 3 engine replicas from its next step
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import textwrap
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.errors import AgentRLError
from agentrl.hub import offline

if TYPE_CHECKING:
    from agentrl.config import Config


def _fields_help() -> str:
    from agentrl.config import field_docs

    lines = ["config fields (set with key=value):"]
    for key, default, doc in field_docs():
        lines.append(f"  {key} = {default}")
        lines.extend(textwrap.wrap(doc, 88, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


# The epilog of the commands that take config overrides, a stand-in for every config field and its
# doc: those are read from the config classes' source (seconds of parsing), so they are rendered
# when a help is printed, not each time a command line is parsed.
_FIELDS = "(every config field, set with key=value)"


class _FieldsHelp(argparse.RawDescriptionHelpFormatter):
    """The help formatter that renders the `_FIELDS` epilog as the config fields' list."""

    def add_text(self, text: str | None) -> None:
        """Add `text`, the config fields' list where it is the `_FIELDS` stand-in."""
        super().add_text(_fields_help() if text is _FIELDS else text)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentrl", description="RL for multi-turn language-model agents.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train an agent", epilog=_FIELDS, formatter_class=_FieldsHelp)
    t.add_argument("args", nargs="*", help="an optional YAML config file, then key=value overrides")
    t.add_argument("--config-path", help="folder of YAML configs (Hydra style)")
    t.add_argument("--config-name", help="config file name in --config-path, without .yaml")
    t.add_argument("--resume", action="store_true", help="continue from the run folder's latest checkpoint")
    t.add_argument("--overwrite", action="store_true",
                   help="start over in a run folder that holds a run (deletes its checkpoints and metrics)")
    pl = sub.add_parser("plan", help="check a config and print its run plan (builds no model, trains nothing)",
                        epilog=_FIELDS, formatter_class=_FieldsHelp)
    pl.add_argument("args", nargs="*", help="an optional YAML config file, then key=value overrides")
    pl.add_argument("--config-path", help="folder of YAML configs (Hydra style)")
    pl.add_argument("--config-name", help="config file name in --config-path, without .yaml")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON (what a run writes to plan.json)")
    r = sub.add_parser("resume", help="continue a run from its latest checkpoint")
    r.add_argument("run_dir")
    r.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.total_steps=100")
    e = sub.add_parser("eval", help="evaluate a run's latest checkpoint")
    e.add_argument("run_dir")
    e.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.eval_episodes=64")
    s = sub.add_parser("serve", help="serve the config's policy over HTTP (OpenAI routes, sessions)",
                       epilog=_FIELDS, formatter_class=_FieldsHelp)
    s.add_argument("args", nargs="*", help="an optional YAML config file, then key=value overrides (serve.port=...)")
    v = sub.add_parser("view", help="write RUN_DIR/view.html: trajectories token by token, curves, alarms")
    v.add_argument("run_dir")
    v.add_argument("--serve", action="store_true", help="also serve it on loopback (every step, loaded on demand)")
    v.add_argument("--port", type=int, default=7860, help="port of --serve (0: any free one)")
    v.add_argument("--max-steps", type=int, default=20, help="dumped steps inlined in the page (evenly spaced)")
    x = sub.add_parser("export", help="write a run's latest checkpoint as a Hugging Face model folder "
                                      "(a LoRA adapter merged into its base)")
    x.add_argument("run_dir")
    x.add_argument("--out", help="folder to write (default RUN_DIR/export)")
    sc = sub.add_parser("scale", help="ask a Ray run (runtime.kind=ray) for N engine replicas, added or removed "
                                      "at the start of its next step")
    sc.add_argument("run_dir")
    sc.add_argument("targets", nargs="*", help="engines=N")
    return p


def cmd_serve(ns: argparse.Namespace) -> int:
    """`agentrl serve`: the policy a run of this config starts from, until Ctrl-C."""
    from agentrl.config import load_config

    path, overrides = _split_config(ns.args, None, None)
    cfg = load_config(path, overrides)
    # Imported once the config is checked: the model stack's imports take seconds a refusal need not wait.
    from agentrl.runtime.serving import serve

    serve(cfg, log=lambda m: print(m, file=sys.stderr))
    return 0


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
    overwrite = ns.overwrite
    if "overwrite=true" in overrides:
        overrides.remove("overwrite=true")
        overwrite = True
    return _train(load_config(path, overrides), resume, overwrite)


def cmd_resume(ns: argparse.Namespace) -> int:
    """`agentrl resume RUN_DIR`: the run's own config, continued from its latest checkpoint."""
    from agentrl.config import load_config

    run_dir = _run_folder_arg(ns.run_dir)
    return _train(load_config(run_dir / "config.yaml", [*ns.overrides, f"run_dir={run_dir}"]), resume=True)


def _train(cfg: Config, resume: bool, overwrite: bool = False) -> int:
    """Train `cfg`'s run, or continue it (`resume`): the one path of `train` and `resume`."""
    from agentrl.metrics import summary_table
    from agentrl.runtime.local import train

    run_dir = cfg.resolved_run_dir()
    _RUN_DIR[:] = [run_dir]
    summary = train(cfg, resume=resume, overwrite=overwrite, log=_log)
    print(summary_table(summary))
    print(f"run folder: {run_dir}")
    return 0


def cmd_plan(ns: argparse.Namespace) -> int:
    """`agentrl plan`: every model-free check of the config, then its run plan; builds nothing."""
    import json

    from agentrl.config import load_config
    from agentrl.runtime.assembly.plan import plan

    path, overrides = _split_config(ns.args, ns.config_path, ns.config_name)
    run_plan = plan(load_config(path, overrides))
    print(json.dumps(run_plan.to_dict(), indent=2) if ns.json else run_plan.describe())
    return 0


def cmd_eval(ns: argparse.Namespace) -> int:
    """`agentrl eval RUN_DIR`: the newest checkpoint that loads (a corrupt newer one is skipped),
    held while it is evaluated, so a trainer still writing the run may prune it meanwhile."""
    run_dir = _run_folder_arg(ns.run_dir)  # before the imports below (seconds): a wrong path is refused at once
    from agentrl.metrics import summary_table
    from agentrl.runtime.local import evaluate_checkpoint

    ckpt, metrics = evaluate_checkpoint(run_dir, ns.overrides, log=_log)
    print(summary_table({"checkpoint": ckpt.name, **metrics}))
    return 0


def _log(message: str) -> None:
    """A run's messages for the user: on stderr (stdout holds the command's result)."""
    print(message, file=sys.stderr)


def cmd_view(ns: argparse.Namespace) -> int:
    """`agentrl view RUN_DIR [--serve]`: write the page, print its path, optionally serve it."""
    from agentrl.viewer import make_server, write_page

    run_dir = _run_dir_arg(ns.run_dir)
    if not 0 <= ns.port <= 65535:
        raise AgentRLError(f"--port={ns.port} must be in [0, 65535] (0 picks a free port)")
    page = write_page(run_dir, ns.max_steps, warn=lambda m: print(m, file=sys.stderr))
    print(page)
    if ns.serve:
        server = make_server(run_dir, page, ns.port)
        print(f"serving on http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C to stop)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return 0


def cmd_export(ns: argparse.Namespace) -> int:
    """`agentrl export RUN_DIR`: the newest checkpoint that loads, as a standalone model folder."""
    from agentrl.config.paths import user_path

    out = user_path(ns.out, "--out") if ns.out is not None else None
    run_dir = _run_dir_arg(ns.run_dir)  # both paths before the import below (seconds): a wrong one is refused at once
    from agentrl.runtime.export import export_run

    ckpt, out = export_run(run_dir, out, log=lambda m: print(m, file=sys.stderr))
    print(f"exported {ckpt.name} of {ns.run_dir} to {out}")
    return 0


def cmd_scale(ns: argparse.Namespace) -> int:
    """`agentrl scale RUN_DIR engines=N`: write the run folder's scale request (runtime/ray/scale_file.py)."""
    from agentrl.runtime.ray.scale_file import SCALE_NAME, check_ray_run, engines_target, request_scale

    run_dir = _run_folder_arg(ns.run_dir)
    n = engines_target(ns.targets)
    check_ray_run(run_dir, n)
    request_scale(run_dir, n)
    print(f"asked {run_dir} for {n} engine replica{'s' * (n != 1)} ({SCALE_NAME}): the run applies it at the start "
          "of its next step, or of its first once resumed; metrics.jsonl logs ray/engine_replicas")
    return 0


def _run_dir_arg(value: str) -> Path:
    """A RUN_DIR argument as a path (`~` expanded), or one line saying why it cannot be one."""
    from agentrl.config.paths import user_path

    return user_path(value, "RUN_DIR")


def _run_folder_arg(value: str) -> Path:
    """A RUN_DIR argument that names a folder a run wrote (it holds config.yaml)."""
    run_dir = _run_dir_arg(value)
    if not (run_dir / "config.yaml").is_file():
        raise AgentRLError(f"{run_dir} is not a run folder (no config.yaml); give the folder a run wrote")
    return run_dir


_RUN_DIR: list[Path] = []  # the run folder of the running command, for the interrupt message


def _on_sigterm(signum: int, frame: object) -> None:
    # SIGTERM stops the run the way Ctrl-C does: stages unwind, files close, the message says how to resume.
    raise _Terminated()


class _Terminated(KeyboardInterrupt):
    """SIGTERM, delivered as an interrupt."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `agentrl` console script."""
    ns = _parser().parse_args(argv)
    offline()  # before any command imports transformers: nothing a command runs reaches for the Hub
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        commands = {"train": cmd_train, "plan": cmd_plan, "resume": cmd_resume, "eval": cmd_eval,
                    "serve": cmd_serve, "view": cmd_view, "export": cmd_export,
                    "scale": cmd_scale}
        return commands[ns.command](ns)
    except AgentRLError as e:
        print(f"agentrl: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # A full disk outside a checkpoint write (metrics, logs): the checkpoints written so far stand.
        where = f" writing {e.filename}" if e.filename else (f" writing in {_RUN_DIR[0]}" if _RUN_DIR else "")
        how = f"; free some space and resume with `agentrl resume {_RUN_DIR[0]}`" if _RUN_DIR else ""
        print(f"agentrl: error: {e.strerror or 'no space left'}{where}{how}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        how = f"; resume with `agentrl resume {_RUN_DIR[0]}`" if _RUN_DIR and ns.command != "eval" else ""
        what = "terminated (SIGTERM)" if isinstance(e, _Terminated) else "interrupted"
        print(f"agentrl: {what}{how}", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(e, _Terminated) else signal.SIGINT)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        _RUN_DIR.clear()


def console(argv: list[str] | None = None) -> None:
    """The `agentrl` console script: `main`, then an exit no thread of a stopped run can abort."""
    code = main(argv)
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        # The run has unwound and closed its files, but a thread of it (an episode's, or one of
        # torch's pools) may still be inside torch: the interpreter's shutdown would destroy torch's
        # threads under it and abort the process (SIGABRT, "terminate called without an active
        # exception") instead of exiting 130 / 143. Nothing is left to run at exit: leave at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
