"""The real process (`python -m gateway serve`): SIGTERM with streams in flight drains and exits 0; an
engine that dies makes readiness false and the process exit non-zero. Also checks the JSON logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import DEFAULT_ENGINE_OPTIONS, MODEL_NAME, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
STREAMS = 4
MAX_TOKENS = 200


def serve_args(model_dir: Path, port: int) -> list[str]:
    args = ["serve", "--model", str(model_dir), "--port", str(port)]
    for name in ("device", "dtype", "max_batch_size", "max_num_tokens", "max_kv_tokens", "served_model_name"):
        args += ["--" + name.replace("_", "-"), str(DEFAULT_ENGINE_OPTIONS[name])]
    return args


def spawn(argv: list[str], log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=log_path.open("w"))


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    def ready() -> bool:
        assert proc.poll() is None, f"server exited with {proc.returncode}"
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False
    wait_for(ready, timeout, "the server to be ready")


@pytest.fixture
def process(tmp_path: Path) -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_sigterm_drains_streams_in_flight_then_exits_0(tiny_model_dir: Path, tmp_path: Path,
                                                       process: list[subprocess.Popen]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    proc = spawn(["-m", "gateway", *serve_args(tiny_model_dir, port), "--drain-timeout", "60",
                  "--log-format", "json"], log_path)
    process.append(proc)
    wait_ready(url, proc)

    results: list[dict] = []
    started = threading.Barrier(STREAMS + 1)

    def stream(i: int) -> None:
        body = {"model": MODEL_NAME, "prompt": f"stream {i}", "max_tokens": MAX_TOKENS, "ignore_eos": True,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120,
                          headers={"x-request-id": f"drain-{i}"}) as r:
            lines = r.iter_lines()
            first = next(lines)
            started.wait()
            rest = [line for line in lines if line]
        events = [json.loads(line[6:]) for line in [first, *rest[:-1]] if line]
        results.append({"done": rest[-1] == "data: [DONE]", "usage": events[-1].get("usage"),
                        "id": r.headers["x-request-id"]})

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(STREAMS)]
    for t in threads:
        t.start()
    started.wait(60)  # every stream has its first chunk
    proc.send_signal(signal.SIGTERM)

    # Draining: readiness false and new requests refused with 503, while the streams go on.
    wait_for(lambda: httpx.get(url + "/health").status_code == 503, 10, "readiness to turn 503")
    assert httpx.get(url + "/health").json() == {"status": "draining"}
    r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "late", "max_tokens": 2})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "service_unavailable"

    for t in threads:
        t.join(120)
    assert proc.wait(60) == 0
    assert len(results) == STREAMS
    for res in results:  # every accepted request completed in full
        assert res["done"] and res["usage"]["completion_tokens"] == MAX_TOKENS

    # JSON logs: one object per line; the access lines carry the request ids the clients saw.
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    access = [rec for rec in records if rec["logger"] == "gateway.access"]
    assert {f"drain-{i}" for i in range(STREAMS)} <= {rec["request_id"] for rec in access}
    assert all(rec["status"] == 200 for rec in access if rec["request_id"].startswith("drain-"))
    assert not any("stream 0" in line for line in log_path.read_text().splitlines())  # no prompts logged


# Runs the real CLI in a process whose native engine loop dies on the first request whose prompt is "die".
DYING_SERVER = """
import sys
from runtime.llm_engine import NativeEngine
from gateway.cli import main

original = NativeEngine._expire_deadlines
def dying(self):
    if any(s.request.prompt == "die" for s in self._requests.values()):
        raise SystemError("injected: the engine loop dies")
    return original(self)
NativeEngine._expire_deadlines = dying
sys.exit(main(sys.argv[1:]))
"""


def test_engine_death_turns_readiness_false_and_exits_nonzero(tiny_model_dir: Path, tmp_path: Path,
                                                              process: list[subprocess.Popen]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = spawn(["-c", DYING_SERVER, *serve_args(tiny_model_dir, port)], tmp_path / "server.log")
    process.append(proc)
    wait_ready(url, proc)
    ok = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "fine", "max_tokens": 2})
    assert ok.status_code == 200
    r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "die", "max_tokens": 2},
                   headers={"x-request-id": "req-death"})
    assert r.status_code == 500 and "(request id: req-death)" in r.json()["error"]["message"]
    assert proc.wait(30) == 1
    log = (tmp_path / "server.log").read_text()
    assert "engine loop died" in log and "fatal: the engine stopped serving" in log
