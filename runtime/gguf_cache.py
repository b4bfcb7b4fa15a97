"""Where a GGUF file's converted checkpoint folder is cached, told without torch (the conversion itself:
runtime/native/models/gguf.py). The front end finds a converted folder here; the first conversion runs in another process
(runtime/served_model.py), so that the front end never loads torch.

The folder is cached under $XDG_CACHE_HOME/trtllm-gateway/gguf/, keyed by the file's path, size and mtime and the
requested dtype.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from gguf import GGUFReader

from runtime.cache import cache_folder
from runtime.config import DTYPE_NAMES

# bump when the converted folder's contents change, so older caches are not reused
FORMAT_VERSION = 2  # 2: config.json names the block types of the layers' matrices (gguf_layer_types)


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
    return cache_folder("gguf")


class CacheFolderError(ValueError):
    """The converted checkpoint cannot be written to the cache folder (a start-up error of one line)."""

    def __init__(self, root: Path, needed: int, reason: str) -> None:
        super().__init__(f"cannot write the converted GGUF checkpoint to {root}: {reason}; it needs about "
                         f"{-(-needed // 2**20)} MiB free there. Set XDG_CACHE_HOME to a writable folder with room "
                         "(the cache is $XDG_CACHE_HOME/trtllm-gateway/gguf, by default under ~/.cache).")


def check_room(root: Path, needed: int) -> None:
    """CacheFolderError when `root` cannot be made or holds less than `needed` bytes free."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not os.access(root, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
        free = shutil.disk_usage(root).free
        if free < needed:
            raise OSError(28, f"only {free // 2**20} MiB free")
    except OSError as exc:
        raise CacheFolderError(root, needed, exc.strerror or str(exc)) from None


def exact_dtype(reader: GGUFReader) -> str:
    """The dtype that holds every weight value exactly: a half type when all matrices use it, else float32."""
    matrix_types = {t.tensor_type.name for t in reader.tensors if len(t.shape) > 1}
    return {"F16": "float16", "BF16": "bfloat16"}.get(matrix_types.pop(), "float32") if len(matrix_types) == 1 \
        else "float32"


def converted_bytes(reader: GGUFReader, dtype: str) -> int:
    """About the size of the converted checkpoint of the file `reader` parsed: its weights in the target dtype, and
    a margin for the rest."""
    itemsize = 4 if (exact_dtype(reader) if dtype == "auto" else dtype) == "float32" else 2
    weights = sum(int(t.n_elements) for t in reader.tensors) * itemsize
    return weights + Path(reader.data.filename).stat().st_size // 10 + 16 * 2**20  # tokenizer files, config


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
    """The GGUF file resolve_gguf(path, dtype) would convert (none converted before is cached); else None.
    CacheFolderError when the cache cannot take the conversion: said at once, before the port opens."""
    found = gguf_file(Path(path))
    root = cache_dir or default_cache_dir()
    if found is None or converted(found, dtype, root).is_dir():
        return None
    check_room(root, converted_bytes(GGUFReader(found), dtype))
    return found


def cached_checkpoint(path: str, dtype: str = "auto") -> str | None:
    """The checkpoint folder `path` serves: itself when it is no GGUF file, its converted folder when cached; None
    when it must be converted first."""
    found = gguf_file(Path(path))
    if found is None:
        return path
    done = converted(found, dtype, default_cache_dir()) / found.stem
    return str(done) if done.is_dir() else None
