"""What a layer pulls in at import: the protocol adapters stay free of torch and xgrammar (the engine's), so
translating a request never loads them (issue 15's structure); so does everything a front-end process imports
(issue 42; tests/e2e/test_front_end_process.py checks a started server's front end)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ADAPTERS = ["adapters.openai.translate", "adapters.openai.tools", "adapters.openai.response_format",
            "adapters.openai.chat", "adapters.openai.completions", "adapters.triton.generate",
            "adapters.triton.inputs", "adapters.triton.outputs"]

# what a front-end process imports: the app and CLI, the process client and its messages, the runtime's contract
FRONT_END = ["gateway.cli", "gateway.app", "gateway.api_servers", "runtime.process.client", "runtime.process.messages",
             "runtime.served_model", "runtime.output_processor", "runtime.validation", "runtime.tokenizer"]


def loaded_after_import(modules: list[str], watched: list[str]) -> list[str]:
    """Which of `watched` a fresh interpreter has loaded after importing `modules`."""
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint([w for w in {watched!r} if w in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return eval(out.stdout)  # noqa: S307 - our own printed list


def test_the_adapters_import_neither_torch_nor_xgrammar() -> None:
    assert loaded_after_import(ADAPTERS, ["torch", "xgrammar"]) == []



def test_the_front_end_imports_neither_torch_nor_xgrammar() -> None:
    assert loaded_after_import(FRONT_END, ["torch", "xgrammar"]) == []
