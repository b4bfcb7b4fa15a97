"""The Starlette application factory.

    create_app(settings, engine=None) -> Starlette

`engine` None builds one from `settings.engine` (runtime.build_engine). The lifespan starts the
engine in the background, so the server answers at once (GET /health is 503 until the model is
loaded, 200 after) and shuts it down on exit. app.state holds `engine`, `settings`, `metrics`
(gateway.metrics.GatewayMetrics; its `.registry` is what /metrics exposes) and `startup_error`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import time
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from gateway.errors import openai_error_response, triton_error_response
from gateway.metrics import GatewayMetrics
from gateway.middleware import ApiKeyMiddleware, RequestContextMiddleware, request_id_of
from gateway.openai_routes import openai_routes
from gateway.ops_routes import ops_routes
from gateway.settings import Settings
from runtime.engine import Engine
from runtime.errors import InvalidRequestError

log = logging.getLogger("gateway")


def _triton_routes(metrics: GatewayMetrics, engine: Engine) -> list[BaseRoute]:
    # The Triton dialect lives in its own modules (owned separately); wire it when present.
    if importlib.util.find_spec("gateway.triton_routes") is None:
        return []
    from gateway.triton_routes import triton_routes

    if importlib.util.find_spec("gateway.triton_metrics") is not None:
        from gateway.triton_metrics import register

        register(metrics.registry, engine)
    return list(triton_routes)


def _http_error(request: Request, exc: Exception) -> Response:
    """404/405 etc. from routing, in the dialect of the path."""
    assert isinstance(exc, HTTPException)
    detail = f"Invalid URL ({request.method} {request.url.path})" if exc.status_code == 404 else exc.detail
    err = InvalidRequestError(detail)
    render = triton_error_response if request.url.path.startswith("/v2") else openai_error_response
    response = render(err, request_id_of(request.scope))
    response.status_code = exc.status_code
    return response


def _internal_error(request: Request, exc: Exception) -> Response:
    render = triton_error_response if request.url.path.startswith("/v2") else openai_error_response
    return render(exc, request_id_of(request.scope))


async def _start_engine(app: Starlette) -> None:
    settings: Settings = app.state.settings
    engine: Engine = app.state.engine
    try:
        await engine.start()
    except Exception as exc:  # the server stays up to say why (503 on /health) unless told to exit
        app.state.startup_error = f"{type(exc).__name__}: {exc}"
        log.exception("engine failed to start")
        on_fatal: Callable[[], None] | None = getattr(app.state, "on_fatal", None)
        if on_fatal is not None:
            on_fatal()
        return
    info = engine.model_info
    log.info("ready: model '%s' (%s backend, %s, %s) at %s/v1", info.name, info.backend, info.device,
             info.dtype, settings.url)


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    task = asyncio.create_task(_start_engine(app))
    try:
        yield
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await app.state.engine.shutdown(app.state.settings.drain_timeout)


def create_app(settings: Settings, engine: Engine | None = None) -> Starlette:
    """The gateway app: OpenAI routes, Triton routes, /health, /metrics, over `engine`."""
    if engine is None:
        from runtime import build_engine

        engine = build_engine(settings.engine)
    metrics = GatewayMetrics()
    metrics.watch_engine(engine)
    routes = [*openai_routes(), *ops_routes(), *_triton_routes(metrics, engine)]
    app = Starlette(
        routes=routes,
        lifespan=_lifespan,
        middleware=[
            Middleware(RequestContextMiddleware, metrics=metrics),
            Middleware(ApiKeyMiddleware, api_keys=settings.api_keys),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.startup_error = None
    app.state.created = int(time.time())  # /v1/models' "created"
    return app


__all__ = ["create_app"]
