"""Where a GGUF file's converted checkpoint folder is cached, told without torch (the conversion itself:
runtime/models/gguf.py). The front end finds a converted folder here; the first conversion runs in another process
(runtime/served_model.py), so that the front end never loads torch.

The folder is cached under $XDG_CACHE_HOME/trtllm-gateway/gguf/, keyed by the file's path, size and mtime and the
requested dtype.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from runtime.config import DTYPE_NAMES

# bump when the converted folder's contents change, so older caches are not reused
FORMAT_VERSION = 1


def gguf_file(path: Path) -> Path | None:
    """The .gguf file `path` names (the file, or a folder holding exactly one); None when it names no GGUF file."""
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"no such GGUF file: {path}")
        return path
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise ValueError(f"{path} holds {len(found)} .gguf files ({', '.join(f.name for f in found)}); "
                         "pass the one to serve")
    return found[0] if found else None


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "trtllm-gateway" / "gguf"


def converted(gguf: Path, dtype: str, root: Path) -> Path:
    """The cache folder of `gguf` converted to `dtype`, keyed by the file's path, size and mtime."""
    if dtype != "auto" and dtype not in DTYPE_NAMES:
        raise ValueError(f"unsupported dtype {dtype!r} (use auto, {', '.join(DTYPE_NAMES)})")
    stat = gguf.stat()
    key = hashlib.sha256(
        f"{gguf.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0{dtype}\0{FORMAT_VERSION}".encode()
    ).hexdigest()[:16]
    return root / key


def unconverted_gguf(path: str, dtype: str = "auto", cache_dir: Path | None = None) -> Path | None:
    """The GGUF file resolve_gguf(path, dtype) would convert (none converted before is cached); else None."""
    found = gguf_file(Path(path))
    if found is None or converted(found, dtype, cache_dir or default_cache_dir()).is_dir():
        return None
    return found


def cached_checkpoint(path: str, dtype: str = "auto") -> str | None:
    """The checkpoint folder `path` serves: itself when it is no GGUF file, its converted folder when cached; None
    when it must be converted first."""
    found = gguf_file(Path(path))
    if found is None:
        return path
    done = converted(found, dtype, default_cache_dir()) / found.stem
    return str(done) if done.is_dir() else None
