"""What a layer pulls in at import (issues 15 and 42): the protocol adapters stay free of torch and xgrammar (the
engine's), so translating a request never loads them; so does everything a front-end process imports
(tests/e2e/test_front_end_process.py checks a started server's front end); runtime/'s contract (its top-level
modules) imports no torch; and runtime/native/ is imported by none of gateway/, adapters/, runtime/process/,
runtime/trtllm/ or the contract."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import runtime
import runtime.process
import runtime.trtllm

ROOT = Path(__file__).resolve().parents[2]

ADAPTERS = ["adapters.openai.translate", "adapters.openai.tools", "adapters.openai.response_format",
            "adapters.openai.chat", "adapters.openai.completions", "adapters.triton.generate",
            "adapters.triton.inputs", "adapters.triton.outputs"]

# what a front-end process imports: the app and CLI, the process client and its messages, the runtime's contract
FRONT_END = ["gateway.cli", "gateway.app", "gateway.api_servers", "runtime.process.client", "runtime.process.messages",
             "runtime.served_model", "runtime.output_processor", "runtime.validation", "runtime.tokenizer"]


def modules_of(package: object) -> list[str]:
    """Every module of `package` (its subpackages included), by name, __main__ aside."""
    found = pkgutil.walk_packages(package.__path__, package.__name__ + ".")  # type: ignore[attr-defined]
    return [m.name for m in found if not m.name.endswith("__main__")]


CONTRACT = ["runtime", *(m for m in modules_of(runtime) if m.count(".") == 1 and not m.startswith(
    ("runtime.native", "runtime.process", "runtime.trtllm")))]
NOT_NATIVE = [*CONTRACT, *modules_of(runtime.process), *modules_of(runtime.trtllm), "gateway.cli", "gateway.app",
              "gateway.api_servers", "gateway.triton_grpc", *ADAPTERS]


def loaded_after_import(modules: list[str], watched: list[str]) -> list[str]:
    """Which of `watched` (a name, or a package's prefix ending in '.') a fresh interpreter has loaded after
    importing `modules`."""
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            f"print(sorted({{w for w in {watched!r} for n in sys.modules if n == w or w.endswith('.') and "
            f"n.startswith(w)}}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return eval(out.stdout)  # noqa: S307 - our own printed list


def test_the_adapters_import_neither_torch_nor_xgrammar() -> None:
    assert loaded_after_import(ADAPTERS, ["torch", "xgrammar"]) == []


def test_the_front_end_imports_neither_torch_nor_xgrammar() -> None:
    assert loaded_after_import(FRONT_END, ["torch", "xgrammar"]) == []


def test_the_contract_imports_no_torch() -> None:
    assert len(CONTRACT) > 15 and "runtime.engine" in CONTRACT and "runtime.output_processor" in CONTRACT
    assert loaded_after_import(CONTRACT, ["torch", "xgrammar"]) == []


def test_nothing_outside_the_engine_core_imports_native() -> None:
    assert "runtime.trtllm.engine" in NOT_NATIVE and "runtime.process.client" in NOT_NATIVE
    assert loaded_after_import(NOT_NATIVE, ["runtime.native."]) == []
    # (that the check sees runtime.native where it is imported: the next test's engine-core process)


def test_the_engine_core_process_loads_xgrammar_with_its_first_guided_request() -> None:
    """xgrammar and the transformers it imports took 0.8 s of every core's start, guided requests or none. The same
    interpreter shows that the check sees runtime.native where it is imported (one interpreter with torch fewer)."""
    assert loaded_after_import(["runtime.native.core_process"], ["xgrammar", "runtime.native."]) == ["runtime.native."]
