"""Smoke runs of the benchmark scripts (issue 15): each script end to end on the CPU, on a tiny model, in
seconds, so a refactor that breaks one fails here instead of on the device. Figures mean nothing here;
the tests check that each script runs and writes what it promises.

Marked `benchmark_smoke` (`pytest -m benchmark_smoke` selects them; a plain `pytest` runs them too).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.smoke import thread_server
from tests.e2e.conftest import RunningServer
from tests.tiny_models import build_tiny_model


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "benchmark_smoke: a benchmark script run end to end on the CPU in seconds")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with its tokenizer (tests/tiny_models.py)."""
    return build_tiny_model(tmp_path_factory.mktemp("bench-models"), "llama")


@pytest.fixture(scope="session")
def smoke_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The --work folder of the gpu_bench-family smokes: their random checkpoints (smoke-llama1b, smoke-small) are
    written by the first script and reused by the others (each costs a transformers import and 1-3 s of CPU)."""
    return tmp_path_factory.mktemp("smoke-work")


@pytest.fixture
def load_generator_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks.procs.run_load_generator without its process: benchmarks.serve.main with the same arguments in
    this one, which saves a Python start with torch (5 to 10 s on this 2-core box) per call."""
    from benchmarks import serve

    def run_load_generator(argv: list[str], timeout: float = 600.0) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            code = serve.main([*argv, "--quiet", "--json", str(out)])
            assert code == 0, f"load generator exited {code}: {argv}"
            return json.loads(out.read_text())

    for module in ("benchmarks.procs", "benchmarks.overhead", "benchmarks.peer_cpu", "benchmarks.grpc_vs_http",
                   "benchmarks.cpu_ab"):
        monkeypatch.setattr(f"{module}.run_load_generator", run_load_generator)


@pytest.fixture(scope="module")
def gateway(tiny_model: Path) -> Iterator[RunningServer]:
    """The gateway on the tiny model, shared by a module's tests."""
    server = thread_server(tiny_model).start()
    yield server
    server.stop()
