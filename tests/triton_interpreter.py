"""Kernel tests without a GPU: a test file's Triton kernels run in Triton's interpreter on the CPU, in a child
pytest process (TRITON_INTERPRET must be set before Triton is first imported, which other modules of the
session may already have done). On a CUDA machine the same tests run natively, in process.

One child runs every selected test file that calls run_in_interpreter, for the whole run: it starts in the
background as soon as the tests are collected (`start_interpreter_run`, from tests/conftest.py, for the files whose
test_kernels_in_triton_interpreter is selected), and each file's test waits for it and checks its own results. Under pytest-xdist the first worker to finish collecting starts it
and every worker reads its results from a folder they share (a child per file cost each its own start: Python,
torch, Triton and the tiny models, about 30 s of CPU over the seven files)."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

RUN_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
kernels = pytest.mark.skipif(not RUN_HERE, reason="runs in the interpreter child process")
# a GPU benchmark's CPU smoke run (tests/benchmarks): in the interpreter child, which has Python, torch and Triton
# started already (a `python -m benchmarks.X` of its own cost each ~3 s of CPU); a GPU runs the benchmark itself in
# benchmarks/gpu_smoke.sh
interpreter_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available(),
                                      reason="a CPU smoke run of a GPU benchmark: in the interpreter child process")

# pytest plugins the kernel tests do not use, left out of the child: loading them (and rewriting their modules'
# asserts) took 2-3 s per child here
UNUSED_PLUGINS = ("langsmith_plugin", "schemathesis", "hypothesispytest", "benchmark", "anyio")
CHILD_TIMEOUT = 900.0  # s: its files take about a minute alone, more beside the workers

ROOT = Path(__file__).resolve().parent.parent  # pytest's rootdir (pyproject.toml): node ids are relative to it


def _patch_helpers_once() -> None:
    """Triton's interpreter patches triton.language (some 250 builtins, each listed with inspect.getmembers) at each
    kernel launch, and again at each call of a @triton.jit helper inside the kernel, where the launch has patched
    it already: most of the interpreter run's CPU that is not the kernels' own. A helper's call is left to the
    launch's patching when every language module it sees is patched (its program_id is no longer the builtin); a
    launch patches, and afterwards restores, as Triton does."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:  # no Triton: the kernel tests skip
        return
    patch_lang = getattr(interpreter, "_patch_lang", None)
    if patch_lang is None or not hasattr(interpreter, "_LangPatchScope"):  # another Triton: as it is
        return

    def patch_unless_patched(fn: Any) -> Any:
        langs = [v for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)]
        if langs and not any(tl.core.is_builtin(lang.program_id) for lang in langs):
            return interpreter._LangPatchScope()  # nothing to restore
        return patch_lang(fn)

    interpreter._patch_lang = patch_unless_patched


def _round_as_the_gpu() -> None:
    """Triton's interpreter narrows float32 by its own rounding: to bfloat16 and float16 in a plain cast by
    truncation, to E4M3 without carrying a rounded-up mantissa into the exponent (15.9 becomes 8): 2% of a token's
    activations came out half their value. The GPU rounds to nearest even, as torch's casts do here."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    convert = interpreter._convert_float
    narrow = {tl.float8e4nv: torch.float8_e4m3fn, tl.bfloat16: torch.bfloat16, tl.float16: torch.float16}
    bits = {1: (torch.uint8, np.uint8), 2: (torch.int16, np.uint16)}  # as the interpreter holds them

    def convert_to_nearest(input: Any, input_dtype: Any, output_dtype: Any, rounding_mode: Any) -> Any:
        if input_dtype != tl.float32 or output_dtype not in narrow:
            return convert(input, input_dtype, output_dtype, rounding_mode)
        values = torch.from_numpy(np.ascontiguousarray(input, dtype=np.float32)).to(narrow[output_dtype])
        torch_bits, numpy_bits = bits[values.element_size()]
        return values.view(torch_bits).numpy().view(numpy_bits)

    interpreter._convert_float = convert_to_nearest


if os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available():
    _patch_helpers_once()
    _round_as_the_gpu()


_folder: Path | None = None  # where the run's child writes its output (start_interpreter_run)
_waiting: threading.Thread | None = None  # in the process that started the child: waits for it, writes its code


def start_interpreter_run(test_files: Iterable[Path], basetemp: Path) -> None:
    """Start the child that runs `test_files` in Triton's interpreter, unless this run has started it already.
    `basetemp`: pytest's temporary folder of this process; under xdist its parent is the run's, shared by the
    workers."""
    global _folder, _waiting
    _folder = (basetemp.parent if "PYTEST_XDIST_WORKER" in os.environ else basetemp) / "triton-interpreter"
    files = sorted({Path(f).resolve() for f in test_files})
    if RUN_HERE or not files:
        return
    folder = _folder
    folder.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(folder / "claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:  # another worker started it
        return
    disable = [arg for name in UNUSED_PLUGINS for arg in ("-p", f"no:{name}")]
    # -rfEsxXp: a line per test with its outcome, without the captured output of passes (a failure's report shows)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *disable, "-rfEsxXp",
               "--continue-on-collection-errors", *map(str, files)]
    output = open(folder / "output", "w")  # noqa: SIM115 - the thread below closes it
    child = subprocess.Popen(command, env={**os.environ, "TRITON_INTERPRET": "1"}, stdout=output,
                             stderr=subprocess.STDOUT, text=True, cwd=ROOT)

    def wait() -> None:
        try:
            code = child.wait(CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            child.kill()
            code = child.wait()
        output.close()
        (folder / "code.tmp").write_text(str(code))
        (folder / "code.tmp").rename(folder / "code")  # whole, for the workers that wait on it

    _waiting = threading.Thread(target=wait, name="triton-interpreter-run", daemon=True)
    _waiting.start()


def finish_interpreter_run() -> None:
    """At the end of the session of the process that started the child: wait for it (the other workers may still
    be waiting on its results)."""
    if _waiting is not None:
        _waiting.join()


def run_in_interpreter(test_file: str, passed: int) -> None:
    """Expect `passed` tests of `test_file` to pass in the run's interpreter child, and none to fail."""
    if RUN_HERE:
        pytest.skip("the kernels run directly in this process")
    folder = _folder
    assert folder is not None, "tests/conftest.py's pytest_collection_finish starts the interpreter run"
    deadline = time.monotonic() + CHILD_TIMEOUT + 60
    while not (folder / "code").exists():
        assert time.monotonic() < deadline, "the interpreter run did not finish"
        time.sleep(0.2)
    code, stdout = int((folder / "code").read_text()), (folder / "output").read_text()
    path = Path(test_file).resolve()
    outcomes = [m[1] for m in re.finditer(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+?)(?:::| |$)", stdout, re.M)
                if (ROOT / m[2]).resolve() == path]
    failures = stdout.find("= FAILURES =")
    report = stdout[failures:failures + 8000] if failures >= 0 else stdout[-4000:]
    assert code in (0, 1), report  # 1: some test failed (here or in another file); else pytest broke
    assert outcomes.count("PASSED") == passed and not {"FAILED", "ERROR"} & set(outcomes), report
