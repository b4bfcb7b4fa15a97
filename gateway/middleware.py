"""Pure-ASGI middleware: request ids, per-endpoint request counting, the access log.

Pure ASGI (not BaseHTTPMiddleware) so `receive` reaches the routes untouched: the disconnect
watchers depend on it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence

from starlette.datastructures import MutableHeaders
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.logs import request_id_var
from gateway.metrics import GatewayMetrics

REQUEST_ID_HEADER = "x-request-id"
access_log = logging.getLogger("gateway.access")


def request_id_of(scope: Scope) -> str:
    """The request id assigned by RequestContextMiddleware (also echoed as the x-request-id header)."""
    return scope.get("state", {}).get("request_id", "")


def report_status(scope: Scope, status: int) -> None:
    """Log and count the request as `status`, whatever its status line said: a stream that sent 200 and
    then ended with an error event (cut by the drain timeout) is an error in the logs and metrics."""
    scope.setdefault("state", {})["reported_status"] = status


class RequestContextMiddleware:
    """Assigns a request id (client's x-request-id if given), echoes it, counts responses by status."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, routes: Sequence[BaseRoute] = ()) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = list(routes)

    def _endpoint(self, scope: Scope) -> str:
        """The route template (never the raw path: label cardinality stays bounded). Requests refused
        before routing (401, 413, 503 while draining) are matched here, so they count under their route."""
        route = scope.get("route")
        if route is None:
            route = next((r for r in self.routes if r.matches(scope)[0] is not Match.NONE), None)
        return getattr(route, "path", None) or "unmatched"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope["headers"]).get(REQUEST_ID_HEADER.encode())
        request_id = incoming.decode("latin-1")[:128] if incoming else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        token = request_id_var.set(request_id)
        started = time.monotonic()
        status = 500  # if the app dies before sending a status line

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = MutableHeaders(scope=message)
                headers.setdefault(REQUEST_ID_HEADER, request_id)
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            status = scope["state"].get("reported_status", status)
            self.metrics.requests.labels(endpoint=self._endpoint(scope), status=str(status)).inc()
            duration_ms = round((time.monotonic() - started) * 1000, 1)
            access_log.info("%s %s %d %.1fms", scope["method"], scope["path"], status, duration_ms,
                            extra={"method": scope["method"], "path": scope["path"], "status": status,
                                   "duration_ms": duration_ms})
            request_id_var.reset(token)
