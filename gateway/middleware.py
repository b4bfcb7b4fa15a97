"""Pure-ASGI middleware: request ids, per-endpoint request counting, optional API-key auth.

Pure ASGI (not BaseHTTPMiddleware) so `receive` reaches the routes untouched: the disconnect
watchers depend on it.
"""

from __future__ import annotations

import hmac
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import AuthenticationError, openai_error_response, triton_error_response
from gateway.metrics import GatewayMetrics

REQUEST_ID_HEADER = "x-request-id"
# Probes and scrapers never authenticate.
_OPEN_PATHS = ("/health", "/metrics")


def request_id_of(scope: Scope) -> str:
    """The request id assigned by RequestContextMiddleware (also echoed as the x-request-id header)."""
    return scope.get("state", {}).get("request_id", "")


class RequestContextMiddleware:
    """Assigns a request id (client's x-request-id if given), echoes it, counts responses by status."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope["headers"]).get(REQUEST_ID_HEADER.encode())
        request_id = incoming.decode("latin-1")[:128] if incoming else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
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
            route = scope.get("route")
            # Label by route template, never the raw path, to keep label cardinality bounded.
            endpoint = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()


class ApiKeyMiddleware:
    """Requires `Authorization: Bearer <key>` with one of `api_keys` (except probes and /metrics)."""

    def __init__(self, app: ASGIApp, api_keys: list[str]) -> None:
        self.app = app
        self.keys = [k.encode() for k in api_keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in _OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        auth = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = auth.partition(b" ")
        if scheme.lower() == b"bearer" and any(hmac.compare_digest(token.strip(), k) for k in self.keys):
            await self.app(scope, receive, send)
            return
        exc = AuthenticationError("Incorrect API key provided." if auth else
                                  "You didn't provide an API key (Authorization: Bearer <key>).")
        render = triton_error_response if scope["path"].startswith("/v2") else openai_error_response
        await render(exc, request_id_of(scope))(scope, receive, send)
