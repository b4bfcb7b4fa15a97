"""Helpers of the benchmark smoke tests: run a script as `python -m`, check figures, serve the gateway in a thread."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_module(module: str, *args: str, timeout: float = 120.0, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """`python -m benchmarks.<module> ARGS` from the repository root; its output captured."""
    return subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def output_of(proc: subprocess.CompletedProcess[str]) -> str:
    """The tail of a finished process's output, for assertion messages."""
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def positive(*values: Any) -> bool:
    """Every value a finite number above zero."""
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


class ThreadServer:
    """The real gateway on a model, served by uvicorn in a daemon thread of this process (no process start)."""

    def __init__(self, model: Path, **engine_options: Any) -> None:
        import uvicorn

        from gateway.app import create_app
        from gateway.settings import Settings
        from runtime.config import EngineConfig

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        options = dict(model=str(model), device="cpu", dtype="float32", max_batch_size=8, max_num_tokens=512,
                       max_kv_tokens=4096, served_model_name="tiny") | engine_options
        self.settings = Settings(host="127.0.0.1", port=port, drain_timeout=0.0, engine=EngineConfig(**options))
        self.url = f"http://127.0.0.1:{port}"
        self.app = create_app(self.settings)
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def start(self, timeout: float = 60.0) -> ThreadServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.app.state.startup_error:
                raise RuntimeError(f"engine failed to start: {self.app.state.startup_error}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"gateway on {self.url} not ready after {timeout} s")

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
