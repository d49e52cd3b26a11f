"""Reading a dataset file (JSONL, JSON, Parquet, CSV) with Hugging Face `datasets`, in one line
per error: the math env's questions and the seed agents' prompts come from such files."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def read_table(path: str, where: str, suffixes: tuple[str, ...] = tuple(FORMATS)) -> Any:
    """The rows of `path` as a `datasets.Dataset` (read once per file version); errors are one
    line starting with `where` (the setting that named the file). `suffixes`: the accepted kinds."""
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise ConfigError(f"{where}={path!r}: no such file")
    if p.suffix.lower() not in suffixes:
        raise ConfigError(f"{where}={path!r} must end in {', '.join(suffixes)}")
    return _read(str(p), p.stat().st_mtime_ns, where)


@lru_cache(maxsize=8)  # every episode builds an env: read each file once per process
def _read(path: str, mtime: int, where: str) -> Any:
    import datasets

    datasets.disable_progress_bars()  # errors below must stay one line on stderr
    datasets.logging.set_verbosity_error()
    try:
        ds = datasets.load_dataset(FORMATS[Path(path).suffix.lower()], data_files=path, split="train")
    except Exception as e:  # malformed files raise many types; the first line says which row
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{where}={path!r}: could not read it: {first}") from None
    if len(ds) == 0:
        raise ConfigError(f"{where}={path!r} has no rows")
    return ds
