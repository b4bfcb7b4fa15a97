"""--read-timeout: a client that stalls while sending a request is cut off instead of held for ever.

uvicorn 0.54 closes idle keep-alive connections (timeout_keep_alive, after a response) but has no timeout
for a request being sent: 300 connections that sent partial headers stayed open indefinitely, and a
stalled body held SIGTERM for the whole drain timeout. Two parts, one setting:

- headers: `http_protocol(timeout)` is uvicorn's HTTP protocol (httptools where installed, else h11) with a
  timer: a request's line and headers must arrive within `timeout` of the connection opening (or of the first
  byte after a response), else the connection is closed. A total, not an idle, limit: a client trickling a
  byte at a time could otherwise stretch the headers out for ever. Headers are capped at MAX_HEADER_BYTES
  (h11 caps them at 16 KB itself; httptools has no cap).
- body: ReadTimeoutMiddleware lets each read of the body wait `timeout` at most (an idle limit, like
  nginx's client_body_timeout: a body up to --max-body-bytes may take longer as a whole on a slow link).
  Past it the route answers 408 in its dialect and the connection is closed (the client is not sending,
  and the rest of its body could only be discarded). A body read still waiting at the drain timeout is
  interrupted like a generation (503), so SIGTERM waits for a stalled body at most the smaller timeout.
"""

from __future__ import annotations

import asyncio

from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.errors import BodyReadTimeoutError, render_for_path
from gateway.middleware import request_id_of
from gateway.settings import Settings
from gateway.shutdown import on_drain_timeout

try:  # uvicorn's C parser (about 8% less front-end CPU per streamed token than h11: benchmarks/RESULTS.md)
    from uvicorn.protocols.http.httptools_impl import (
        HttpToolsProtocol as _FastestProtocol,
    )
except ImportError:  # httptools not installed
    _FastestProtocol = H11Protocol  # type: ignore[assignment, misc]


def read_timeout_middleware(settings: Settings) -> Middleware:
    """The body half of --read-timeout; ValueError (at start-up) unless it is positive."""
    if not settings.read_timeout > 0:
        raise ValueError(f"--read-timeout must be positive (got {settings.read_timeout})")
    return Middleware(ReadTimeoutMiddleware, timeout=settings.read_timeout)


class ReadTimeoutMiddleware:
    """Each body read waits `timeout` s at most; then 408 (or the drain's 503) and `Connection: close`."""

    def __init__(self, app: ASGIApp, timeout: float) -> None:
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_done = False
        failure: BaseException | None = None  # what ended the body read
        started = False

        async def timed_receive() -> Message:
            nonlocal body_done, failure
            if body_done:  # after the body only a disconnect comes, whenever it does
                return await receive()
            interrupts: list[BaseException] = []
            try:
                async with asyncio.timeout(self.timeout) as deadline:
                    def interrupt(error: BaseException) -> bool:
                        if deadline.expired():  # the read timeout came first
                            return False
                        interrupts.append(error)
                        deadline.reschedule(-1)  # now: the wait below ends with TimeoutError
                        return True

                    withdraw = on_drain_timeout(interrupt)
                    try:
                        message = await receive()
                    finally:
                        withdraw()
            except TimeoutError:
                failure = interrupts[0] if interrupts else BodyReadTimeoutError(self.timeout)
                raise failure from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def closing_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if failure is not None:  # the rest of the body is not coming: nothing to keep the connection for
                    MutableHeaders(scope=message)["connection"] = "close"
            await send(message)

        try:
            await self.app(scope, timed_receive, closing_send)
        except Exception as exc:
            if exc is not failure or started:
                raise
            # a route that let it escape: answer it here rather than as a 500
            await render_for_path(scope["path"], exc, request_id_of(scope))(scope, receive, closing_send)


MAX_HEADER_BYTES = 64 * 1024  # a request line and headers larger than this get 400 and the connection closed


class HeaderTimeoutProtocol(_FastestProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's protocol closing a connection whose request headers take over `header_timeout` s or
    MAX_HEADER_BYTES."""

    header_timeout = 30.0  # set by http_protocol()
    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes = 0  # received since the current request's headers began

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        awaiting = self._awaiting_headers()
        super().data_received(data)
        if awaiting and self._awaiting_headers():  # still no complete headers: the bytes were all header bytes
            self._header_bytes += len(data)
            if self._header_bytes > MAX_HEADER_BYTES and not self.transport.is_closing():
                self.send_400_response("Request headers too large.")
        else:
            self._header_bytes = 0
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)

    def _awaiting_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _watch_headers(self) -> None:
        # Armed once per request (not re-armed by each byte); idle connections after a response are left
        # to uvicorn's keep-alive timeout, which data arriving cancels.
        if not self._awaiting_headers():
            self._stop_header_timer()
        elif self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_timed_out)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        upgraded = self.transport.get_protocol() is not self  # a WebSocket handed on: not ours to close
        if self._awaiting_headers() and not upgraded and not self.transport.is_closing():
            self.transport.close()


def http_protocol(header_timeout: float) -> type[HeaderTimeoutProtocol]:
    """uvicorn's `http` protocol class for --read-timeout `header_timeout`."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout": header_timeout})


__all__ = ["MAX_HEADER_BYTES", "HeaderTimeoutProtocol", "ReadTimeoutMiddleware", "http_protocol", "read_timeout_middleware"]
