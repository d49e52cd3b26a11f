"""Paths a config or a command line gives: checked in one line before anything is made of them,
and expanded (`~`, `~user`) the same way everywhere.

The file system would otherwise answer deep inside a run, in a traceback: a name longer than
255 bytes (ENAMETOOLONG), `~nouser/...` (expanduser's RuntimeError), a NUL byte (ValueError),
text the file system cannot encode. An empty string is never a path: a field that can be left
out takes null, not "" (which would silently mean the default, or the current folder).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.errors import ConfigError, shown

if TYPE_CHECKING:  # checks.py calls check_config_paths; the type only is needed here
    from agentrl.config.schema import Config

NAME_MAX = 255  # bytes of one file name (Linux, macOS)
PATH_MAX = 4000  # bytes of a whole path, under Linux's 4096 with room for what a run adds inside


def cache_home() -> Path:
    """The default root of agentrl's caches: $AGENTRL_CACHE, else ~/.cache/agentrl."""
    return Path(os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl").expanduser()


def user_path(value: str, name: str) -> Path:
    """`value` as a path (`~` expanded), or a one-line ConfigError naming `name` and the problem."""
    if not value.strip():
        raise ConfigError(f"{name} is empty; give a path")
    if "\0" in value:
        raise ConfigError(f"{name}={shown(value)} contains a NUL byte; give a path")
    try:
        path = Path(value).expanduser()
    except RuntimeError:  # ~user of no user, or ~ without a home folder
        user = value.split("/", 1)[0]
        raise ConfigError(f"{name}={shown(value)}: {user} names no user's home folder here; give the path "
                          "without it") from None
    try:
        encoded = [os.fsencode(part) for part in path.parts]
    except UnicodeEncodeError:
        raise ConfigError(f"{name}={shown(value)} holds characters this file system cannot name "
                          f"(encoding {sys.getfilesystemencoding()})") from None
    for part, raw in zip(path.parts, encoded):
        if len(raw) > NAME_MAX:
            raise ConfigError(f"{name}={shown(value)}: the name {shown(part)} is {len(raw)} bytes long; a file "
                              f"or folder name may have at most {NAME_MAX}")
    if sum(len(raw) + 1 for raw in encoded) > PATH_MAX:
        raise ConfigError(f"{name}={shown(value)} is longer than {PATH_MAX} bytes; give a shorter path")
    return path


def check_config_paths(cfg: Config) -> None:
    """Every path of the config (run folder, model, caches, Ray's folder, shared weights, key file, .py imports)."""
    user_path(cfg.output_dir, "output_dir")
    check_exp_name(cfg.exp_name)
    optional = {"run_dir": cfg.run_dir, "model.path": cfg.model.path, "model.cache_dir": cfg.model.cache_dir,
                "runtime.temp_dir": cfg.runtime.temp_dir, "engine.weights_dir": cfg.engine.weights_dir,
                "serve.weights_dir": cfg.serve.weights_dir}
    for name, value in optional.items():
        if value is not None:
            if not value.strip():
                raise ConfigError(f"{name} is empty; give a path, or null for the default")
            path = user_path(value, name)
            if name != "run_dir":  # the run folder's own checks come with the run (runtime/run_folder.py)
                _not_under_a_file(path, value, name)
    if cfg.engine.api_key_file is not None:  # a file, read where the key is needed (runtime/assembly/engines.py)
        user_path(cfg.engine.api_key_file, "engine.api_key_file")
    if cfg.engine.vllm.python is not None:  # an interpreter, checked in the preflight (runtime/assembly/engines.py)
        user_path(cfg.engine.vllm.python, "engine.vllm.python")
    for i, entry in enumerate(cfg.imports):
        if not entry.strip():
            raise ConfigError(f"imports[{i}] is empty; give a module name or a .py file")
        if entry.endswith(".py"):
            user_path(entry, f"imports[{i}]")


def _not_under_a_file(path: Path, value: str, name: str) -> None:
    """The folder `name` names is not a file, nor inside one (where nothing can be written)."""
    for p in [path, *path.parents]:
        if p.exists():
            if not p.is_dir():
                where = "is a file" if p == path else f"is inside {p}, a file"
                raise ConfigError(f"{name}={shown(value)} {where}; give a folder")
            return


def check_exp_name(name: str) -> None:
    """exp_name names a folder under output_dir: not empty, not absolute, never above output_dir."""
    if not name.strip():
        raise ConfigError("exp_name is empty; give the experiment a name (its run folder is output_dir/exp_name)")
    path = user_path(name, "exp_name")
    if path.is_absolute() or name.startswith("~"):
        raise ConfigError(f"exp_name={shown(name)} is a path; give a name (output_dir/exp_name is the run folder), "
                          "or set run_dir for an exact folder")
    if any(part in (".", "..") for part in Path(name).parts) or name.strip(".") == "":
        raise ConfigError(f"exp_name={shown(name)} leads outside output_dir; give a name without . or .. parts")


def expand_paths(cfg: Config) -> None:
    """Expand `~` in every path field, so that each part of a run reads the same folder."""
    cfg.output_dir = os.path.expanduser(cfg.output_dir)
    for section, key in ((cfg, "run_dir"), (cfg.model, "path"), (cfg.model, "cache_dir"), (cfg.runtime, "temp_dir"),
                         (cfg.engine, "weights_dir"), (cfg.engine, "api_key_file"), (cfg.serve, "weights_dir")):
        value = getattr(section, key)
        if value is not None:
            setattr(section, key, os.path.expanduser(value))
    cfg.imports = [os.path.expanduser(p) if p.endswith(".py") else p for p in cfg.imports]
