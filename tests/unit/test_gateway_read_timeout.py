"""gateway.read_timeout's body half over plain ASGI calls: a stalled body read is 408 (the drain's 503 when
the drain timeout interrupts it first) with `Connection: close`; reads after the body are never timed. The
header half and the real sockets are in tests/e2e/test_read_timeout.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import Message, Receive, Scope, Send

from gateway.errors import ServerDrainingError
from gateway.read_timeout import ReadTimeoutMiddleware, read_timeout_middleware
from gateway.settings import Settings
from gateway.shutdown import Drain


async def body_then_disconnect(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the body (letting errors escape, as a careless route would), then waits for the disconnect."""
    body = await Request(scope, receive).body()
    assert (await receive())["type"] == "http.disconnect"
    await PlainTextResponse(body.decode())(scope, receive, send)


class Client:
    """Sends `chunks` of a body, then stalls (setting `stalled`) or, with `disconnect_after`, ends the
    body and disconnects that many seconds later."""

    def __init__(self, chunks: list[bytes], disconnect_after: float | None = None) -> None:
        self.chunks = list(chunks)
        self.disconnect_after = disconnect_after
        self.stalled = asyncio.Event()
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        if self.chunks:
            chunk = self.chunks.pop(0)
            more = bool(self.chunks) or self.disconnect_after is None
            return {"type": "http.request", "body": chunk, "more_body": more}
        if self.disconnect_after is not None:
            await asyncio.sleep(self.disconnect_after)
            return {"type": "http.disconnect"}
        self.stalled.set()
        await asyncio.Event().wait()  # the client sends nothing more
        raise AssertionError("unreachable")

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def answer(self) -> tuple[int, dict[bytes, bytes], bytes]:
        start, body = self.sent[0], b"".join(m.get("body", b"") for m in self.sent[1:])
        return start["status"], dict(start["headers"]), body


def scope() -> Scope:
    return {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "state": {}}


def test_a_read_timeout_below_or_at_zero_is_refused_at_start_up() -> None:
    with pytest.raises(ValueError, match="--read-timeout must be positive"):
        read_timeout_middleware(Settings(read_timeout=0))


async def test_a_stalled_body_read_is_408_and_closes_the_connection() -> None:
    client = Client([b'{"pro'])
    await ReadTimeoutMiddleware(body_then_disconnect, timeout=0.05)(scope(), client.receive, client.send)
    status, headers, body = client.answer()
    assert (status, headers[b"connection"]) == (408, b"close")
    assert json.loads(body)["error"]["code"] == "request_timeout"


async def test_reads_after_the_body_are_not_timed() -> None:
    client = Client([b'{"prompt":', b' "hi"}'], disconnect_after=0.2)  # waits for the disconnect past the timeout
    await ReadTimeoutMiddleware(body_then_disconnect, timeout=0.05)(scope(), client.receive, client.send)
    status, headers, body = client.answer()
    assert (status, body) == (200, b'{"prompt": "hi"}') and b"connection" not in headers


async def test_the_drain_timeout_interrupts_a_stalled_body_read_with_503() -> None:
    drain, client, request = Drain(), Client([b'{"pro']), scope()

    async def serve() -> None:
        with drain.tracking(request):
            await ReadTimeoutMiddleware(body_then_disconnect, timeout=3600)(request, client.receive, client.send)

    task = asyncio.create_task(serve())
    await asyncio.wait_for(client.stalled.wait(), 60)
    drain.interrupt_all(ServerDrainingError("shutting down"))
    await asyncio.wait_for(task, 60)
    status, headers, body = client.answer()
    assert (status, headers[b"connection"]) == (503, b"close")
    assert json.loads(body)["error"]["message"] == "shutting down"
    assert request["state"]["reported_status"] == 503 and drain.in_flight == 0
