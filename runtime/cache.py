"""Where the server keeps what it makes for later starts: $XDG_CACHE_HOME/trtllm-gateway/<kind> (by default under
~/.cache): converted GGUF checkpoints, and the default folder run-time LoRA adapters load from."""

from __future__ import annotations

import os
from pathlib import Path


def cache_folder(kind: str) -> Path:
    """The cache's folder for `kind` ("gguf", "lora"), not made here."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "trtllm-gateway" / kind
