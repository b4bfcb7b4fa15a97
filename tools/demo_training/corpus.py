"""Training corpus for the demo model: the running interpreter's own standard-library sources.

The file list is sorted and the train/held-out split is a hash of each file's relative path, so the
same interpreter always yields the same corpus and the same split, with no download.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Folders that are test suites, third-party code or generated tables rather than ordinary Python.
SKIPPED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "pydoc_data", "encodings"}
)
HELD_OUT_PERCENT = 5


@dataclass(frozen=True)
class Corpus:
    """Source texts split into training and held-out files (relative path -> text, sorted by path)."""

    root: str
    train: dict[str, str]
    held_out: dict[str, str]

    def num_chars(self) -> tuple[int, int]:
        """(training characters, held-out characters)."""
        return sum(map(len, self.train.values())), sum(map(len, self.held_out.values()))


def is_held_out(rel_path: str) -> bool:
    """Deterministic split: about HELD_OUT_PERCENT % of files, chosen by a hash of the relative path."""
    digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELD_OUT_PERCENT


def stdlib_files(root: Path) -> list[Path]:
    """Sorted .py files under `root`, skipping test suites, site-packages and machine-specific files."""
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in SKIPPED_DIRS for part in rel.parts[:-1]):
            continue
        if rel.name.startswith("_sysconfigdata"):  # describes the build machine, not Python code style
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def load_corpus(root: str | None = None, max_files: int | None = None) -> Corpus:
    """Read the standard library of the running interpreter (or `root`); `max_files` caps it for quick runs."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    train: dict[str, str] = {}
    held_out: dict[str, str] = {}
    for path in stdlib_files(base)[:max_files]:
        rel = path.relative_to(base).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a handful of legacy files are not UTF-8; they are not worth special handling
        (held_out if is_held_out(rel) else train)[rel] = text
    return Corpus(root=str(base), train=train, held_out=held_out)
