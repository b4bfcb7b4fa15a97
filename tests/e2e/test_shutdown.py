"""The real process (`python -m gateway serve`): SIGTERM with streams in flight drains and exits 0; an
engine that dies makes readiness false and the process exit non-zero. Also checks the JSON logs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.conftest import DEFAULT_ENGINE_OPTIONS, MODEL_NAME, POLL, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
STREAMS = 4
MAX_TOKENS = 200


def serve_args(model_dir: Path, port: int) -> list[str]:
    args = ["serve", "--model", str(model_dir), "--port", str(port), "--grpc-port", "none"]  # no fixed port
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
            return POLL.get(url + "/health").status_code == 200
        except httpx.TransportError:
            return False
    wait_for(ready, timeout, "the server to be ready")


@dataclass
class Served:
    proc: subprocess.Popen
    port: int
    log: Path | None = None  # its stderr

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def engine_core(self) -> psutil.Process:
        """Its engine-core process (under the zygote it forked from: runtime/process/launcher.py)."""
        (core,) = [p for p in psutil.Process(self.proc.pid).children(recursive=True) if p.name() == "engine-core"]
        return core


# Runs the real CLI in a process whose native engine loop dies on the first request whose prompt is "die".
DYING_SERVER = """
import sys
from runtime.native.engine_core import EngineCore
from gateway.cli import main

original = EngineCore._expire_deadlines
def dying(self):
    if any(s.request.prompt == "die" for s in self.requests.values()):
        raise SystemError("injected: the engine loop dies")
    return original(self)
EngineCore._expire_deadlines = dying
sys.exit(main(sys.argv[1:]))
"""


# test of this module -> (program, serve flags) of the server it starts and ends
SERVERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "test_sigterm_drains_streams_in_flight_then_exits_0": (("-m", "gateway"),
                                                           ("--drain-timeout", "60", "--log-format", "json")),
    "test_engine_death_turns_readiness_false_and_exits_nonzero": (("-c", DYING_SERVER), ("--no-engine-process",)),
    "test_a_killed_engine_core_ends_streams_with_an_error_and_the_server_exits_nonzero": (("-m", "gateway"), ()),
    "test_drain_timeout_ends_streams_with_an_error_event_and_the_end_marker": (
        ("-m", "gateway"), ("--drain-timeout", "0", "--log-format", "json")),
}


def start_together(model_dir: Path, folder: Path,
                   specs: dict[str, tuple[Sequence[str], Sequence[str]]]) -> dict[str, Served]:
    """{name: server} for {name: (program, serve flags)}: all spawned at once (on the tiny model, logging to
    folder/NAME.log), then each waited for. A start is ~8 s of mostly one-threaded imports on the 2-core box: four
    at once take ~19 s there, against ~32 s one after another. Those started are killed if one fails to start."""
    out: dict[str, Served] = {}
    try:
        for name, (program, flags) in specs.items():
            port = free_port()
            while port in {s.port for s in out.values()}:  # each port is free until its server binds it
                port = free_port()
            log = folder / f"{name}.log"
            out[name] = Served(spawn([*program, *serve_args(model_dir, port), *flags], log), port, log)
        for served in out.values():
            wait_ready(served.url, served.proc)
    except BaseException:
        stop_all(out.values())
        raise
    return out


def stop_all(servers: Iterable[Served]) -> None:
    """Kill those still running."""
    for served in servers:
        if served.proc.poll() is None:
            served.proc.kill()
            served.proc.wait(10)


@pytest.fixture(scope="module")
def servers(request: pytest.FixtureRequest, tiny_model_dir: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    """{test name: its server, ready}, for the tests of SERVERS this session runs, started together before the
    first of them (start_together). Each test ends its own; any still running at the end is killed."""
    wanted = [item.originalname for item in request.session.items
              if item.module is request.module and item.originalname in SERVERS]
    started = start_together(tiny_model_dir, tmp_path_factory.mktemp("shutdown"),
                             {name: SERVERS[name] for name in wanted})
    yield started
    stop_all(started.values())


@pytest.fixture
def served(request: pytest.FixtureRequest, servers: dict[str, Served]) -> Served:
    """This test's server (SERVERS)."""
    return servers[request.node.originalname]


def test_sigterm_drains_streams_in_flight_then_exits_0(served: Served) -> None:
    proc, url, log_path = served.proc, served.url, served.log
    core = served.engine_core()

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

    # A request whose body is still to come holds the drain open until the probes below are done: the streams alone
    # could all finish first under load, and the server then exits (its port closed: the probes were refused).
    # `Expect: 100-continue`: the server answers "100 Continue" once the request is in the app, counted in flight.
    held_body = json.dumps({"model": MODEL_NAME, "prompt": "held", "max_tokens": 3, "temperature": 0}).encode()
    held = socket.create_connection(("127.0.0.1", served.port), timeout=60)
    held.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                 b"Expect: 100-continue\r\nx-request-id: drain-held\r\nContent-Length: %d\r\n\r\n" % len(held_body))
    held_answer = held.makefile("rb")
    assert held_answer.readline() == b"HTTP/1.1 100 Continue\r\n" and held_answer.readline() == b"\r\n"

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(STREAMS)]
    for t in threads:
        t.start()
    started.wait(60)  # every stream has its first chunk
    proc.send_signal(signal.SIGTERM)

    # Draining: readiness false and new requests refused with 503, while the streams go on.
    wait_for(lambda: POLL.get(url + "/health").status_code == 503, 10, "readiness to turn 503")
    assert httpx.get(url + "/health").json() == {"status": "draining"}
    # Triton's probes answer as Triton does, not with the drain's 503: a failed liveness probe gets the pod killed
    assert httpx.get(url + "/v2/health/live").status_code == 200
    assert httpx.get(url + "/v2/health/ready").status_code == 400
    r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "late", "max_tokens": 2})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "service_unavailable"

    held.sendall(held_body)  # the request accepted before the drain completes
    assert held_answer.readline() == b"HTTP/1.1 200 OK\r\n"
    assert json.loads(held_answer.read().split(b"\r\n\r\n", 1)[1])["usage"]["completion_tokens"] == 3
    held.close()
    for t in threads:
        t.join(120)
    assert proc.wait(60) == 0
    assert not core.is_running()  # no process left behind
    assert len(results) == STREAMS
    for res in results:  # every accepted request completed in full
        assert res["done"] and res["usage"]["completion_tokens"] == MAX_TOKENS

    # JSON logs: one object per line; the access lines carry the request ids the clients saw.
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    access = [rec for rec in records if rec["logger"] == "gateway.access"]
    assert {f"drain-{i}" for i in range(STREAMS)} | {"drain-held"} <= {rec["request_id"] for rec in access}
    assert all(rec["status"] == 200 for rec in access if rec["request_id"].startswith("drain-"))
    assert not any("stream 0" in line for line in log_path.read_text().splitlines())  # no prompts logged


def test_engine_death_turns_readiness_false_and_exits_nonzero(served: Served) -> None:
    """The in-process engine (--no-engine-process): its step loop dies."""
    proc, url = served.proc, served.url
    ok = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "fine", "max_tokens": 2})
    assert ok.status_code == 200
    r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "die", "max_tokens": 2},
                   headers={"x-request-id": "req-death"})
    assert r.status_code == 500 and "(request id: req-death)" in r.json()["error"]["message"]
    assert proc.wait(30) == 1
    log = served.log.read_text()
    assert "engine loop died" in log and "fatal: the engine stopped serving" in log


def test_a_killed_engine_core_ends_streams_with_an_error_and_the_server_exits_nonzero(served: Served) -> None:
    proc, url = served.proc, served.url
    core = served.engine_core()
    body = {"model": MODEL_NAME, "prompt": "long", "max_tokens": 240, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        core.kill()
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2][6:])["error"]
    assert "engine-core process exited unexpectedly" in error["message"]
    assert proc.wait(30) == 1
    assert "fatal: the engine stopped serving" in served.log.read_text()


def test_drain_timeout_ends_streams_with_an_error_event_and_the_end_marker(served: Served) -> None:
    """Streams still running when --drain-timeout passes used to be cut mid chunked body (no finish reason,
    no error, no [DONE]) while the logs said 200: now each gets its dialect's error event and end marker,
    and is logged and counted as a 503. A request stalled in its body is answered 503 too."""
    proc, url, port, log_path = served.proc, served.url, served.port, served.log

    stalled = socket.create_connection(("127.0.0.1", port), timeout=60)
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 100\r\nx-request-id: cut-body\r\n\r\n{\"model\"")
    long = {"max_tokens": 240, "temperature": 0, "stream": True}
    with httpx.Client(base_url=url, timeout=60) as c, \
            c.stream("POST", "/v1/completions", headers={"x-request-id": "cut-openai"},
                     json={**long, "model": MODEL_NAME, "prompt": "long", "ignore_eos": True}) as openai_stream, \
            c.stream("POST", f"/v2/models/{MODEL_NAME}/generate_stream", headers={"x-request-id": "cut-triton"},
                     json={**long, "text_input": "long", "min_length": 240}) as triton_stream:
        openai_lines, triton_lines = openai_stream.iter_lines(), triton_stream.iter_lines()
        assert next(openai_lines).startswith("data: ") and next(triton_lines).startswith("data: ")
        proc.send_signal(signal.SIGTERM)  # both streams have more than 200 tokens to go
        openai_rest = [line for line in openai_lines if line]
        triton_rest = [line for line in triton_lines if line]
    assert openai_rest[-1] == "data: [DONE]"
    error = json.loads(openai_rest[-2][6:])["error"]
    assert error["code"] == "service_unavailable" and "--drain-timeout" in error["message"]
    triton_error = json.loads(triton_rest[-1][6:])
    assert list(triton_error) == ["error"] and "--drain-timeout" in triton_error["error"]
    answer = stalled.makefile("rb").read()  # the server answers and closes the connection
    assert answer.startswith(b"HTTP/1.1 503 ") and b"--drain-timeout" in answer
    assert proc.wait(60) == 0

    log = log_path.read_text()
    assert "ASGI callable returned without completing response" not in log
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    statuses = {rec["request_id"]: rec["status"] for rec in records if rec["logger"] == "gateway.access"}
    assert {rid: statuses.get(rid) for rid in ("cut-openai", "cut-triton", "cut-body")} == dict.fromkeys(
        ("cut-openai", "cut-triton", "cut-body"), 503)
