"""What a layer pulls in at import: the protocol adapters stay free of torch and xgrammar (the engine's), so
translating a request never loads them (issue 15's structure)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ADAPTERS = ["adapters.openai.translate", "adapters.openai.tools", "adapters.openai.response_format",
            "adapters.openai.chat", "adapters.openai.completions", "adapters.triton.generate",
            "adapters.triton.inputs", "adapters.triton.outputs"]


def loaded_after_import(modules: list[str], watched: list[str]) -> list[str]:
    """Which of `watched` a fresh interpreter has loaded after importing `modules`."""
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint([w for w in {watched!r} if w in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return eval(out.stdout)  # noqa: S307 - our own printed list


def test_the_adapters_import_neither_torch_nor_xgrammar() -> None:
    assert loaded_after_import(ADAPTERS, ["torch", "xgrammar"]) == []

