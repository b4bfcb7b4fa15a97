"""The Starlette application factory.

    create_app(settings, engine=None) -> Starlette

`engine` None builds one from `settings.engine` (runtime.build_engine). The lifespan starts the
engine in the background, so the server answers at once (GET /health is 503 until the model is
loaded, 200 after) and shuts it down on exit. app.state holds `engine`, `settings`, `metrics`
(gateway.metrics.GatewayMetrics; its `.registry` is what /metrics exposes), `auth`
(gateway.auth.AuthPolicy), `key_limits` (gateway.key_limits.KeyLimits or None), `drain`
(gateway.shutdown.Drain), `limits` (RequestLimits), `prepare` (runtime.workers.WorkerPool for large bodies),
`responses` (gateway.response_store.ResponseStore: stored Responses API responses), `startup_error` and
`fatal_error` (the engine died while serving). The server may set `on_ready` (called once the engine has
started), `on_fatal` (called when it fails to start or dies), `before_engine_shutdown` (awaited before the engine
shuts down) and `serve_after` (start serving only once the engine has started and it has returned).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from adapters.limits import RequestLimits
from gateway.auth import ApiKeyMiddleware, AuthPolicy
from gateway.errors import MethodNotAllowedError, RouteNotFoundError, render_for_path
from gateway.key_limits import KeyLimitsMiddleware, key_limits
from gateway.limits import BodySizeLimitMiddleware
from gateway.lora_routes import check_adapter_names, lora_roots, lora_routes
from gateway.metrics import GatewayMetrics
from gateway.middleware import RequestContextMiddleware, request_id_of
from gateway.openai_routes import openai_routes
from gateway.openapi import openapi_routes
from gateway.ops_routes import ops_routes
from gateway.read_timeout import read_timeout_middleware
from gateway.response_store import ResponseStore
from gateway.responses_routes import responses_routes
from gateway.settings import Settings
from gateway.shutdown import Drain, DrainMiddleware, watch_engine
from runtime.engine import Engine
from runtime.errors import InvalidRequestError
from runtime.workers import WorkerPool

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
    """404/405 etc. from routing, in the dialect of the path (and logged with that status)."""
    assert isinstance(exc, HTTPException)
    err: InvalidRequestError
    if exc.status_code == 404:
        err = RouteNotFoundError(f"Invalid URL ({request.method} {request.url.path})")
    elif exc.status_code == 405:
        err = MethodNotAllowedError(exc.detail)
    else:
        err = InvalidRequestError(exc.detail)
    response = render_for_path(request.url.path, err, request_id_of(request.scope))
    response.status_code = exc.status_code
    return response


def _internal_error(request: Request, exc: Exception) -> Response:
    return render_for_path(request.url.path, exc, request_id_of(request.scope))


def _fatal(app: Starlette, why: str) -> None:
    """The engine is gone: readiness false for good, and the process should exit non-zero."""
    app.state.fatal_error = why
    log.error("fatal: %s; exiting so that the orchestrator restarts the server", why)
    on_fatal: Callable[[], None] | None = getattr(app.state, "on_fatal", None)
    if on_fatal is not None:
        on_fatal()


async def _start_engine(app: Starlette) -> bool:
    """Start the engine; False (and the reason in app.state.startup_error) when it fails."""
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
        return False
    on_ready: Callable[[], None] | None = getattr(app.state, "on_ready", None)
    if on_ready is not None:
        on_ready()
    info = engine.model_info
    log.info("ready: model '%s' (%s backend, %s, %s) at %s/v1", info.name, info.backend, info.device,
             info.dtype, settings.url)
    return True


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    async def start_then_watch(started: asyncio.Future[bool] | None = None) -> None:
        ok = await _start_engine(app)
        if started is not None:
            started.set_result(ok)
        if ok:
            await watch_engine(app.state.engine, app.state.drain, lambda why: _fatal(app, why))

    settings: Settings = app.state.settings
    grpc_server = None
    if settings.grpc_port is not None:  # before the engine starts: a taken port fails the start at once
        from gateway.triton_grpc import start_grpc_server

        try:
            grpc_server = await start_grpc_server(app, settings.grpc_port, settings.host)
        except OSError as exc:
            app.state.startup_error = str(exc)
            raise
    # A front end beside others on one port (--api-servers) takes connections only once it serves: the first
    # answers /health (503 while loading) for all of them.
    serve_after: Callable[[], Awaitable[None]] | None = getattr(app.state, "serve_after", None)
    started = asyncio.get_running_loop().create_future() if serve_after is not None else None
    task = asyncio.create_task(start_then_watch(started))
    if started is not None and serve_after is not None and await started:
        await serve_after()
    try:
        yield
    finally:
        app.state.drain.begin()  # the watcher must not mistake this shutdown for a death
        if grpc_server is not None:  # in-flight calls get the drain timeout, as HTTP requests
            await grpc_server.stop(settings.drain_timeout)
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        before: Callable[[], Awaitable[None]] | None = getattr(app.state, "before_engine_shutdown", None)
        if before is not None:  # e.g. the other front ends sharing the engine core drain first
            await before()
        await app.state.engine.shutdown(settings.drain_timeout)
        app.state.prepare.shutdown()


def create_app(settings: Settings, engine: Engine | None = None) -> Starlette:
    """The gateway app: OpenAI routes, Triton routes, /health, /metrics, over `engine`."""
    if engine is None:
        from runtime import build_engine

        engine = build_engine(settings.engine)
    check_adapter_names(settings.engine.lora_modules, engine.model_info.name, "--lora-modules")
    metrics = GatewayMetrics()
    metrics.watch_engine(engine)
    admin = lora_routes()  # run-time LoRA loading: guarded by --admin-api-key when one is set
    if settings.enable_lora_loading:
        log.info("run-time LoRA loading on: adapters load from %s", ", ".join(lora_roots(settings.lora_root)))
    routes = [*openai_routes(), *responses_routes(), *admin, *ops_routes(), *openapi_routes(),
              *_triton_routes(metrics, engine)]
    auth = AuthPolicy.from_settings(settings, admin_paths=[getattr(r, "path", "") for r in admin])
    limits = key_limits(settings, auth)
    drain = Drain()
    # Outermost first: ids and counting see every answer (408s included), CORS answers preflights before
    # auth, draining refuses before any work, auth before the body is read.
    middleware = [Middleware(RequestContextMiddleware, metrics=metrics, routes=routes),
                  read_timeout_middleware(settings)]
    if settings.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"],
                                     allow_headers=["*"], expose_headers=["x-request-id"]))
    middleware += [
        Middleware(DrainMiddleware, drain=drain),
        Middleware(ApiKeyMiddleware, policy=auth),
        *([Middleware(KeyLimitsMiddleware, limits=limits, exempt_paths=auth.admin_paths)] if limits else []),
        Middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes),
    ]
    app = Starlette(
        routes=routes,
        lifespan=_lifespan,
        middleware=middleware,
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.auth = auth
    app.state.key_limits = limits
    app.state.drain = drain
    app.state.limits = RequestLimits(
        max_n=settings.max_n, max_stop_strings=settings.max_stop_strings,
        max_stop_string_length=settings.max_stop_string_length, max_bad_words=settings.max_bad_words,
        max_logit_bias=settings.max_logit_bias,
        max_messages=settings.max_messages, max_prompts=settings.max_prompts)
    app.state.prepare = WorkerPool("parse")  # parsing and translating large bodies, off the event loop
    app.state.responses = ResponseStore(settings.responses_store_size, settings.responses_store_ttl,
                                        settings.responses_store_bytes)
    app.state.startup_error = None
    app.state.fatal_error = None
    app.state.created = int(time.time())  # /v1/models' "created"
    return app


__all__ = ["create_app"]
