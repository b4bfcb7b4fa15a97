"""Graceful shutdown and engine-death handling.

On SIGTERM (see gateway.cli): `Drain.begin()` turns readiness (/health) to 503 and answers every new
request with 503, while requests already in flight (streams included) run to completion for up to
--drain-timeout; only then is the HTTP server told to exit, so no accepted request is lost and the
process exits 0. `watch_engine` turns an engine that dies while serving into readiness false and a
fatal exit (non-zero), so an orchestrator restarts the process.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import ServerDrainingError, render_for_path
from gateway.middleware import request_id_of
from runtime.engine import Engine

log = logging.getLogger("gateway.shutdown")
# Probes and scrapes are neither counted as in-flight work nor refused while draining.
_OPS_PATHS = ("/health", "/metrics")


class Drain:
    """In-flight request count and the draining flag of one app."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0

    def begin(self) -> None:
        if not self.draining:
            log.info("draining: refusing new requests, %d in flight", self.in_flight)
        self.draining = True

    async def wait_idle(self, timeout: float, poll: float = 0.05) -> bool:
        """Wait until nothing is in flight (True) or `timeout` seconds passed (False)."""
        deadline = time.monotonic() + timeout
        while self.in_flight > 0:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(poll)
        return True


class DrainMiddleware:
    """Counts in-flight requests; while draining, answers new ones with 503 (Retry-After) instead."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _OPS_PATHS:
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            exc = ServerDrainingError("The server is shutting down and takes no new requests; retry on another replica.")
            await render_for_path(scope["path"], exc, request_id_of(scope))(scope, receive, send)
            return
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1


async def watch_engine(engine: Engine, drain: Drain, on_death: Callable[[str], None], poll: float = 0.2) -> None:
    """Call once the engine started: if it stops being ready without a shutdown, call `on_death(why)`."""
    while not drain.draining:
        if not engine.ready:
            on_death("the engine stopped serving (its loop died); see the error logged above")
            return
        await asyncio.sleep(poll)


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM/SIGINT drains (see module docstring) before exiting.

    A second signal exits at once, as plain uvicorn does. A drained exit is a normal one: the
    signal is not re-raised, so the process exits 0.
    """

    def __init__(self, config: uvicorn.Config, drain: Drain, drain_timeout: float) -> None:
        super().__init__(config)
        self._drain = drain
        self._drain_timeout = drain_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drainer: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain.draining or self._loop is None:
            super().handle_exit(sig, frame)
            return
        self._drain.begin()
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drainer = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        if not await self._drain.wait_idle(self._drain_timeout):
            log.warning("drain timeout (%.1f s) passed with %d requests in flight; aborting them",
                        self._drain_timeout, self._drain.in_flight)
        self.should_exit = True
