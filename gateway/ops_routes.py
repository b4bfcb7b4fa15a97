"""Operational routes: GET /health (readiness) and GET /metrics (Prometheus exposition)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route


async def health(request: Request) -> Response:
    """200 {"status": "ready"} once the engine serves; 503 while loading, draining, after a failed start or
    after the engine died. While the engine starts, or builds faster code while it serves, "phase" says what
    it is doing ("converting the GGUF file ...", "compiling one-stream decode steps ...")."""
    state = request.app.state
    if state.drain.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if state.fatal_error or state.startup_error:
        return JSONResponse({"status": "failed", "error": state.fatal_error or state.startup_error}, status_code=503)
    engine = state.engine
    if engine.degraded is not None:  # still serving on what is left: a load balancer should send elsewhere
        return JSONResponse({"status": "degraded", "error": engine.degraded}, status_code=503)
    ready = engine.ready
    body = {"status": "ready" if ready else "loading"}
    if engine.phase is not None:
        body["phase"] = engine.phase
    return JSONResponse(body, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    """Everything in the app's CollectorRegistry, in the Prometheus text format."""
    return Response(request.app.state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def ops_routes() -> list[BaseRoute]:
    return [Route("/health", health, methods=["GET"]), Route("/metrics", metrics, methods=["GET"])]
