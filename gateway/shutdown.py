"""Graceful shutdown and engine-death handling.

On SIGTERM (see gateway.cli): `Drain.begin()` turns readiness (/health) to 503 and answers every new
request with 503, while requests already in flight (streams included) run to completion for up to
--drain-timeout; only then is the HTTP server told to exit, so no accepted request is lost and the
process exits 0. What still runs at the drain timeout is ended properly rather than cut: each request's
interrupts (`on_drain_timeout`: its generations, a body read) get a ServerDrainingError, so a stream
sends its dialect's error event and end marker, and the request is logged and counted as a 503.
`watch_engine` turns an engine that dies while serving into readiness false and a
fatal exit (non-zero), so an orchestrator restarts the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import ServerDrainingError, error_kind, render_for_path
from gateway.middleware import report_status, request_id_of
from runtime.engine import Engine

log = logging.getLogger("gateway.shutdown")
# Probes and scrapes are neither counted as in-flight work nor refused while draining (Triton's readiness
# says "not ready" itself; a refused liveness probe would get the draining pod killed).
_OPS_PATHS = ("/health", "/metrics", "/v2/health/live", "/v2/health/ready")
# Seconds the requests interrupted at the drain timeout get to send their error event: an engine abort
# takes effect at its next step.
_INTERRUPT_GRACE_S = 2.0

Interrupt = Callable[[BaseException], bool]  # True when it cut something short


@dataclass(eq=False)
class _InFlight:
    scope: Scope
    interrupts: set[Interrupt] = field(default_factory=set)


# The interrupts of the request being served: set per request by DrainMiddleware; the tasks a route
# starts copy the context, so they all register on this one set.
_interrupts_var: contextvars.ContextVar[set[Interrupt] | None] = contextvars.ContextVar("drain_interrupts",
                                                                                        default=None)


def on_drain_timeout(interrupt: Interrupt) -> Callable[[], None]:
    """Have `interrupt(error)` called if the current request is still in flight when --drain-timeout
    passes (it returns whether it cut anything short); returns the function that withdraws it (no-op
    outside a request counted by DrainMiddleware)."""
    interrupts = _interrupts_var.get()
    if interrupts is None:
        return lambda: None
    interrupts.add(interrupt)
    return lambda: interrupts.discard(interrupt)


class Drain:
    """The requests in flight and the draining flag of one app."""

    def __init__(self) -> None:
        self.draining = False
        self._requests: set[_InFlight] = set()

    @property
    def in_flight(self) -> int:
        return len(self._requests)

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

    @contextlib.contextmanager
    def tracking(self, scope: Scope) -> Iterator[None]:
        """Count the request of `scope` as in flight, collecting its interrupts (on_drain_timeout)."""
        request = _InFlight(scope)
        self._requests.add(request)
        reset = _interrupts_var.set(request.interrupts)
        try:
            yield
        finally:
            _interrupts_var.reset(reset)
            self._requests.discard(request)

    def interrupt_all(self, error: BaseException) -> None:
        """Interrupt every request in flight with `error`; those it cut short are logged and counted with
        the error's status (a stream has already sent 200)."""
        for request in list(self._requests):
            cut = [interrupt(error) for interrupt in list(request.interrupts)]  # all of them: no any() shortcut
            if any(cut):
                report_status(request.scope, error_kind(error).status)


class DrainMiddleware:
    """Tracks in-flight requests (Drain.tracking); while draining, answers new ones with 503 (Retry-After)."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _OPS_PATHS:
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            exc = ServerDrainingError()
            await render_for_path(scope["path"], exc, request_id_of(scope))(scope, receive, send)
            return
        with self.drain.tracking(scope):
            await self.app(scope, receive, send)


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

    def __init__(self, config: uvicorn.Config, drain: Drain, drain_timeout: float,
                 on_signal: Callable[[], None] | None = None, ignored: tuple[int, ...] = ()) -> None:
        super().__init__(config)
        self._drain = drain
        self._drain_timeout = drain_timeout
        self._on_signal = on_signal  # e.g. forward to the other front ends (--api-servers)
        self._ignored = ignored  # signals this process leaves to another (a front end's Ctrl-C)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drainer: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig in self._ignored:
            return
        if self._on_signal is not None:
            self._on_signal()
        if self._drain.draining or self._loop is None:
            super().handle_exit(sig, frame)
            return
        self._drain.begin()
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drainer = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        if not await self._drain.wait_idle(self._drain_timeout):
            log.warning("drain timeout (%.1f s) passed with %d requests in flight; ending them with an error",
                        self._drain_timeout, self._drain.in_flight)
            self._drain.interrupt_all(ServerDrainingError(
                f"The server is shutting down and its drain timeout ({self._drain_timeout:g} s, --drain-timeout) "
                "passed before this request finished; it was aborted. Retry on another replica."))
            if not await self._drain.wait_idle(_INTERRUPT_GRACE_S):
                log.warning("%d requests did not end within %.0f s of their interrupt; closing their connections",
                            self._drain.in_flight, _INTERRUPT_GRACE_S)
        self.should_exit = True
