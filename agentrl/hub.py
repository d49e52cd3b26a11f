"""A run never reaches for the Hugging Face Hub.

Model paths are local folders and the embedded default is built here, so a call that would
download (an agent's `AutoTokenizer.from_pretrained("org/name")`, a path that is not a folder)
must fail at once, not retry a network that a machine may not have (huggingface_hub waits
minutes on one that does not answer). Every entry point (the CLI's commands, the Python API's
runs) calls `offline()`; processes started afterwards (Ray's local workers, subprocesses)
inherit it, and the Ray runtime passes it on to the workers of a cluster it joins.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# The variables that set the Hub's offline mode; a user who sets either (to any value) decides.
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def offline() -> None:
    """Put this process in the Hub's offline mode, unless the user's environment sets
    HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE."""
    if any(name in os.environ for name in OFFLINE_VARIABLES):
        return
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants: Any = sys.modules.get("huggingface_hub.constants")  # a module: its names are huggingface_hub's
    if constants is not None:  # it reads the variable once, at import: one imported earlier is told here
        constants.HF_HUB_OFFLINE = True


def offline_env() -> dict[str, str]:
    """The offline variables of this process, for workers that do not inherit its environment."""
    return {name: os.environ[name] for name in OFFLINE_VARIABLES if name in os.environ}
