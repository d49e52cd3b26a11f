"""Reading a run's newest checkpoint while a trainer may still be writing (and pruning) the run.

`agentrl eval` and `agentrl export` pick the newest checkpoint, then load the model from its
folder; a trainer beside them keeps only its newest `trainer.max_checkpoints`, so the folder
picked may be deleted in between. `held_newest` first takes a private view of the checkpoint:
hard links to its files (copies where links cannot be made) in a temporary folder, which keep
every file readable whatever the trainer deletes. The trainer deletes a checkpoint by renaming
it out of the listing first (`checkpoint.discard`), so a checkpoint still under its name after
its files were linked was linked whole; one that vanished meanwhile is picked again from the
newest.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from agentrl.errors import CheckpointError
from agentrl.train.checkpoint import list_checkpoints, read_checkpoint

ATTEMPTS = 5  # pickings in a row that a trainer pruned: far more than one checkpoint interval allows


@contextlib.contextmanager
def held_newest(ckpt_root: Path, warn: Callable[[str], None]) -> Iterator[tuple[Path, Path, tuple] | None]:
    """(checkpoint, its held copy, what read_checkpoint read from the copy) of the newest readable
    checkpoint under `ckpt_root`, held while the block runs; None when there is none.

    Unreadable newer checkpoints are skipped with a warning, as `newest_readable` does; a
    CheckpointError when there are some and none loads.
    """
    parent = ckpt_root.parent
    where = parent if os.access(parent, os.W_OK) else None  # a read-only run: copies in the temp folder
    with tempfile.TemporaryDirectory(prefix=".held-", dir=where) as tmp:
        yield _pick(ckpt_root, Path(tmp), warn)


def _pick(ckpt_root: Path, tmp: Path, warn: Callable[[str], None]) -> tuple[Path, Path, tuple] | None:
    first_error = None
    for _ in range(ATTEMPTS):
        pruned = False
        for ckpt in reversed(list_checkpoints(ckpt_root)):
            held = tmp / ckpt.name
            shutil.rmtree(held, ignore_errors=True)
            if not _link_tree(ckpt, held):
                pruned = True  # deleted while being held: the newest is another one now
                break
            try:
                return ckpt, held, read_checkpoint(held)
            except CheckpointError as e:
                message = str(e).replace(str(held), str(ckpt))  # name the run's checkpoint, not the copy
                first_error = first_error or message
                warn(f"warning: {message}; falling back to an older checkpoint")
        if not pruned:
            break
    if first_error is not None:
        raise CheckpointError(f"no checkpoint in {ckpt_root} loads (newest: {first_error}); "
                              "start over with `agentrl train ... --overwrite`")
    return None


def _link_tree(src: Path, dst: Path) -> bool:
    """Hard-link (or copy) every file of folder `src` under `dst`; False when `src` was deleted
    before all its files were held."""
    try:
        files = [p for p in sorted(src.rglob("*")) if p.is_file()]
        for path in files:
            target = dst / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except OSError as e:
                if e.errno == errno.ENOENT:
                    return False
                shutil.copy2(path, target)  # another file system, or links not allowed
    except FileNotFoundError:
        return False
    return bool(files) and src.is_dir()
