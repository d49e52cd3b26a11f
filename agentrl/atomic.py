"""Files written whole or not at all: a reader sees the old file or the new one, never half of one.

What the package writes for others to read while it runs (metrics.jsonl, summary.json, view.html,
trajectory dumps, weight files that engines load, `agentrl serve`'s admin key) is written to a new
temporary file beside its target, then renamed over it (`os.replace`: atomic within a
filesystem); a write that fails removes its temporary file. Folders (checkpoints, model folders,
the tokenizer cache) are renamed by their own code: an existing folder cannot be replaced in one
step. This module imports nothing of the package, so any module may use it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


def _create(path: Path, private: bool) -> tuple[Path, int]:
    """A new temporary file beside `path` (hidden, its own random name) and its open descriptor.

    O_EXCL and O_NOFOLLOW: never a file or link someone placed there first. `private` gives mode
    0600 from its creation on; otherwise a new file's usual mode (0666 less the umask)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    return tmp, os.open(tmp, _FLAGS, 0o600 if private else 0o666)


def write_atomic(path: str | Path, data: str | bytes, *, private: bool = False) -> Path:
    """Write `data` (text as UTF-8) to `path` whole or not at all, on disk before the rename;
    `private`: readable by this user only (mode 0600), as a secret must be."""
    path = Path(path)
    tmp, fd = _create(path, private)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A new, empty temporary file beside `path`, for a writer that takes a file name (safetensors'
    `save_file`); renamed over `path` when the block ends, removed if it raises."""
    path = Path(path)
    tmp, fd = _create(path, private=False)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
