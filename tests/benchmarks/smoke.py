"""Helpers of the benchmark smoke tests: check figures, serve the gateway in a thread."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tests.e2e.conftest import DEFAULT_ENGINE_OPTIONS, RunningServer
from tests.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def positive(*values: Any) -> bool:
    """Every value a finite number above zero."""
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


def thread_server(model: Path, **engine_options: Any) -> RunningServer:
    """The real gateway on `model`, served by uvicorn in a daemon thread of this process (no process start);
    the e2e suite's RunningServer with the suite's small engine options."""
    from gateway.settings import Settings
    from runtime.config import EngineConfig

    port = free_port()
    options = {**DEFAULT_ENGINE_OPTIONS, "served_model_name": "tiny", "model": str(model), **engine_options}
    return RunningServer(Settings(grpc_port=None, host="127.0.0.1", port=port, drain_timeout=0.0, engine=EngineConfig(**options)))
