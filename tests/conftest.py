"""Shared test setup: the repository root on sys.path (so `pytest` works like `python -m pytest`), no compiled
CPU decode steps unless a test asks for them (compiling takes tens of seconds per engine), and progress as a line
per test file. Servers that tests start take their ports from tests/ports.py (distinct per xdist worker)."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# the test processes (workers, the interpreter child) collect cyclic garbage less often than Python's default (700,
# 10, 10): a worker imports ~3,600 modules, and its collection alone took 8.6-9.5 s of CPU by default, 7.6-7.8 s so
gc.set_threshold(50_000, 20, 20)
os.environ.setdefault("TRTLLM_GATEWAY_CPU_COMPILE", "false")  # inherited by the servers tests start too
if "PYTEST_XDIST_WORKER" in os.environ:
    # one thread per worker process, and per server it starts (an engine's default is all cores but one): workers
    # run side by side, and torch threads oversubscribing the cores wait on each other
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# one build of the CPU kernels for the whole run: tests that point XDG_CACHE_HOME at a temporary folder (where GGUF
# conversions go) would move torch's extension cache there too, and build the kernels again (30 s of CPU each)
os.environ.setdefault("TORCH_EXTENSIONS_DIR",
                      str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_extensions"))

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytest_plugins = ["tests.progress"]
INTERPRETER_TEST = "test_kernels_in_triton_interpreter"  # each kernel test file's check of its interpreter run  # a line per finished test file (tests/progress.py)


@pytest.fixture(autouse=True)
def _keep_torch_threads() -> Iterator[None]:
    """Engines and scripts run in the test process set torch's thread count process-wide (a training script: 2,
    guided_overhead: 1); put it back, so that it stays one per xdist worker."""
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    yield
    if torch is not None:
        torch.set_num_threads(threads)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "long_file: a unit test file that takes tens of seconds (scheduled first)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Test files in the order the workers take them (`--dist loadfile --no-loadscope-reorder`), longest first, so
    that the last ones to run are short: unit files marked long_file (each worker holds two files at a time, so a
    long one queued behind another long one starts late), benchmark smoke runs, e2e files (they start servers), the
    other unit files, then the kernel tests that wait for the interpreter run (done by then)."""
    waiting = {item.path for item in items if getattr(item, "originalname", None) == INTERPRETER_TEST}

    def rank(item: pytest.Item) -> int:
        if item.path in waiting:
            return 4
        if item.get_closest_marker("long_file") is not None:
            return 0
        return {"benchmarks": 1, "e2e": 2}.get(item.path.parent.name, 3)

    items.sort(key=rank)  # (stable: a file's tests keep their order)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the run's Triton-interpreter child for the selected kernel tests, in the background
    (tests/triton_interpreter.py)."""
    from tests.triton_interpreter import start_interpreter_run

    files = {Path(item.path) for item in session.items if getattr(item, "originalname", None) == INTERPRETER_TEST}
    start_interpreter_run(files, session.config._tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.triton_interpreter import finish_interpreter_run

    finish_interpreter_run()
