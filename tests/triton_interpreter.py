"""Kernel tests without a GPU: a test file's Triton kernels run in Triton's interpreter on the CPU, in a child
pytest process (TRITON_INTERPRET must be set before Triton is first imported, which other modules of the
session may already have done). On a CUDA machine the same tests run natively, in process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

RUN_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
kernels = pytest.mark.skipif(not RUN_HERE, reason="runs in the interpreter child process")


def run_in_interpreter(test_file: str, passed: int) -> None:
    """Run `test_file` again under TRITON_INTERPRET=1 and expect `passed` tests to pass there."""
    if RUN_HERE:
        pytest.skip("the kernels run directly in this process")
    child = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", test_file],
                           env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=240)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-2000:]
    assert f"{passed} passed" in child.stdout, child.stdout[-2000:]
