"""--read-timeout through the real process (`python -m gateway serve`) and raw sockets: a stalled body is
answered 408 in the route's dialect and its connection closed, connections whose headers stall (or that
send nothing) are closed, and a stalled body does not hold SIGTERM for the whole drain timeout."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.read_timeout import MAX_HEADER_BYTES
from tests.e2e.conftest import MODEL_NAME, free_port
from tests.e2e.test_shutdown import serve_args, spawn, wait_ready

READ_TIMEOUT_S = 1
# Waiting for the server to answer or close: generous, as a slow box must not fail; without the read
# timeout nothing would ever come and the socket's own timeout fails the test.
WAIT_S = 60


def stalled_body(port: int, path: str, request_id: str = "stalled") -> socket.socket:
    """A connection that promises a 100-byte body, sends 8 bytes of it and then nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
                 f"x-request-id: {request_id}\r\n\r\n".encode() + b'{"model"')
    return sock


def answer(sock: socket.socket) -> tuple[str, dict[str, str], bytes]:
    """(status line, headers, body) of the response, read until the server closes the connection."""
    raw = sock.makefile("rb").read()
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    return status, {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}, body


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen]:
    """One server for the module (a start costs seconds here); the SIGTERM test, last, ends it. Its drain timeout is
    far longer than any wait here, so an exit within WAIT_S shows that nothing waited for it. The engine runs in the
    server's process: read timeouts are the HTTP server's (tests/e2e/test_shutdown.py drains with the engine core)."""
    port = free_port()
    proc = spawn(["-m", "gateway", *serve_args(tiny_model_dir, port), "--read-timeout", str(READ_TIMEOUT_S),
                  "--drain-timeout", "600", "--no-engine-process"],
                 tmp_path_factory.mktemp("read-timeout") / "server.log")
    proc.port = port  # type: ignore[attr-defined]
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def port(served: subprocess.Popen) -> int:
    assert served.poll() is None, "the module's server has exited (the SIGTERM test ends it: it runs last)"
    return served.port  # type: ignore[attr-defined]


def test_a_stalled_body_is_408_in_openai_shape_and_the_connection_closed(port: int) -> None:
    status, headers, body = answer(stalled_body(port, "/v1/completions"))
    assert status.startswith("HTTP/1.1 408 ") and headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert (error["code"], error["type"]) == ("request_timeout", "invalid_request_error")
    assert "--read-timeout" in error["message"]


def test_a_stalled_body_is_408_in_triton_shape_and_the_connection_closed(port: int) -> None:
    status, headers, body = answer(stalled_body(port, f"/v2/models/{MODEL_NAME}/generate"))
    assert status.startswith("HTTP/1.1 408 ") and headers["connection"] == "close"
    assert list(json.loads(body)) == ["error"] and "--read-timeout" in json.loads(body)["error"]


def test_stalled_headers_and_silent_connections_are_closed(port: int) -> None:
    partial = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    partial.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: app")
    silent = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    assert partial.recv(1) == b"" and silent.recv(1) == b""  # closed by the server, nothing sent
    # a request sent in good time on a fresh connection is served as before
    assert httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=WAIT_S,
                      json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize("pieces", [1, 40])
def test_headers_past_the_cap_are_400_and_the_connection_closed(port: int, pieces: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    header = b"x-filler: " + b"a" * (MAX_HEADER_BYTES + 1) + b"\r\n"
    data = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + header
    step = -(-len(data) // pieces)
    try:
        for i in range(0, len(data), step):
            sock.sendall(data[i : i + step])
    except (BrokenPipeError, ConnectionResetError):  # closed while we were still sending: read what it said
        pass
    status, _, _ = answer(sock)
    assert status.startswith("HTTP/1.1 400"), status


def test_a_stalled_body_does_not_hold_sigterm_for_the_drain_timeout(served: subprocess.Popen, port: int) -> None:
    url = f"http://127.0.0.1:{port}"
    sock = stalled_body(port, "/v1/completions")
    assert httpx.get(url + "/health").status_code == 200  # the stalled request is in flight by now
    served.send_signal(signal.SIGTERM)
    status, _, _ = answer(sock)
    assert status.startswith("HTTP/1.1 408 ")
    assert served.wait(WAIT_S) == 0  # far less than the 600 s drain timeout
