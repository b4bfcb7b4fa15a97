"""Kernel tests without a GPU: a test file's Triton kernels run in Triton's interpreter on the CPU, in a child
pytest process (TRITON_INTERPRET must be set before Triton is first imported, which other modules of the
session may already have done). On a CUDA machine the same tests run natively, in process.

One child runs every test file of the session that calls run_in_interpreter (each child costs seconds to start
here: Python, torch, Triton and pytest's plugins), and each file's test checks its own results in that run; under
pytest-xdist, one child per file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

RUN_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
kernels = pytest.mark.skipif(not RUN_HERE, reason="runs in the interpreter child process")

# pytest plugins the kernel tests do not use, left out of the child: loading them (and rewriting their modules'
# asserts) took 2-3 s per child here
UNUSED_PLUGINS = ("langsmith_plugin", "schemathesis", "hypothesispytest", "benchmark", "anyio")

ROOT = Path(__file__).resolve().parent.parent  # pytest's rootdir (pyproject.toml): node ids are relative to it
_runs: dict[Path, subprocess.CompletedProcess[str]] = {}  # test file -> the child run that ran it


def _files_to_run(test_file: Path) -> list[Path]:
    """`test_file` and every other test module of this session that imported run_in_interpreter (pytest imports
    all of them at collection, before any test runs) and whose file has not run yet. Under pytest-xdist, only
    `test_file`: each worker collects every module, but runs only the files it is given, so each worker's child
    ran them all (the same kernels two or three times over)."""
    files = {test_file}
    if "PYTEST_XDIST_WORKER" in os.environ:
        return [test_file]
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and getattr(module, "run_in_interpreter", None) is run_in_interpreter:
            files.add(Path(path).resolve())
    return sorted(f for f in files if f not in _runs)


def run_in_interpreter(test_file: str, passed: int) -> None:
    """Run `test_file` again under TRITON_INTERPRET=1 and expect `passed` tests to pass there and none to fail."""
    if RUN_HERE:
        pytest.skip("the kernels run directly in this process")
    path = Path(test_file).resolve()
    if path not in _runs:
        files = _files_to_run(path)
        disable = [arg for name in UNUSED_PLUGINS for arg in ("-p", f"no:{name}")]
        child = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *disable, "-rA",
                                "--continue-on-collection-errors", *map(str, files)],
                               env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
                               timeout=240)
        _runs.update(dict.fromkeys(files, child))
    child = _runs[path]
    # -rA: one "OUTCOME nodeid" line per test; this file's own, whatever the other files of the run did
    outcomes = [m[1] for m in re.finditer(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+?)(?:::| |$)",
                                          child.stdout, re.M)
                if (ROOT / m[2]).resolve() == path]
    tail = child.stdout[-3000:] + child.stderr[-2000:]
    assert child.returncode in (0, 1), tail  # 1: some test failed (here or in another file); else pytest broke
    assert outcomes.count("PASSED") == passed and not {"FAILED", "ERROR"} & set(outcomes), tail
