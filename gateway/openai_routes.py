"""OpenAI routes: GET /v1/models, GET /v1/models/{model}, POST /v1/completions, POST /v1/chat/completions.

Both POST routes share one path (`serve_generation`, which POST /v1/responses takes too): parse -> translate
-> GenerationStream -> either the shared SSE writer or one JSON body. The endpoints differ only in their
adapter functions.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel
from starlette.datastructures import State
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from adapters.limits import RequestLimits
from adapters.openai import (
    ChatCompletionRequest,
    ChatOutput,
    CompletionOutput,
    CompletionRequest,
    ModelCard,
    ModelList,
    chat_request,
    completion_requests,
    parse_request,
)
from adapters.openai.limits import check_limits
from gateway.disconnect import DisconnectWatch
from gateway.errors import (
    ClientDisconnected,
    ModelNotFoundError,
    log_error,
    openai_error_body,
    openai_error_response,
)
from gateway.generation import GenerationStream
from gateway.limits import parse_json
from gateway.middleware import request_id_of
from gateway.streaming import sse_response
from runtime.engine import Engine
from runtime.errors import EngineNotReadyError
from runtime.request import GenerationRequest, OutputDelta
from runtime.tokenizer import Tokenizer
from runtime.workers import HEAVY_CHARS, WorkerPool

OWNED_BY = "trtllm-gateway"
log = logging.getLogger("gateway.openai")
# nginx's "client closed request": logged and counted, never seen by the (gone) client.
CLIENT_CLOSED = 499
IGNORED_FIELDS_HEADER = "x-ignored-fields"  # request fields we do not know, ignored (see _parse)


class _Output(Protocol):
    def chunks(self, item: tuple[int, OutputDelta]) -> list[dict[str, Any]]: ...
    def final_chunks(self) -> list[dict[str, Any]]: ...
    def add(self, item: tuple[int, OutputDelta]) -> None: ...
    def response(self) -> dict[str, Any]: ...


# (parsed request, response id, model name, adapter, tokenizer) -> (engine requests, output builder)
_Plan = Callable[[Any, str, str, str | None, Tokenizer], tuple[list[GenerationRequest], _Output]]


def ready_engine(request: Request) -> Engine:
    """The app's engine, or EngineNotReadyError (503) while it loads or after it failed."""
    return state_engine(request.app.state)


def state_engine(state: State) -> Engine:
    """ready_engine() for transports without a Starlette request (gRPC): from the app's state."""
    engine: Engine = state.engine
    if not engine.ready:
        why = state.startup_error
        raise EngineNotReadyError(f"The model failed to load: {why}" if why else
                                  "The model is still loading; retry when GET /health returns 200.")
    return engine


def served_adapters(request: Request, engine: Engine) -> dict[str, str]:
    """LoRA adapters the engine serves now (name -> folder): run-time loads included where supported."""
    return state_adapters(request.app.state, engine)


def state_adapters(state: State, engine: Engine) -> dict[str, str]:
    """served_adapters() from the app's state."""
    adapters = engine.lora_adapters()
    return state.settings.engine.lora_modules if adapters is None else adapters


def resolve_model(request: Request, engine: Engine, name: str | None) -> tuple[str, str | None]:
    """(model name to report, LoRA adapter or None) for the request's `model` field."""
    base = engine.model_info.name
    if name is None or name == base:
        return base, None
    if name in served_adapters(request, engine):
        return name, name
    raise ModelNotFoundError(name)


async def read_body(request: Request) -> bytes:
    """The raw body; ClientDisconnected (499, nobody to answer) when the client leaves while sending it."""
    try:
        return await request.body()
    except ClientDisconnect:
        raise ClientDisconnected() from None


async def read_json(request: Request) -> Any:
    """The decoded JSON body; InvalidRequestError (400) when it does not parse or nests too deep."""
    return parse_json(await read_body(request), request.app.state.settings.max_json_depth)


def _log_prompt(request_id: str, req: Any) -> None:
    # Only with --log-prompts: prompts may hold personal or confidential data.
    fields = req.model_dump(include={"prompt", "messages", "instructions", "input"}, exclude_none=True)
    log.info("request %s prompt: %s", request_id, json.dumps(fields, ensure_ascii=False))


async def _collect(stream: GenerationStream, output: _Output) -> dict[str, Any]:
    try:
        async for item in stream:
            output.add(item)
    finally:
        stream.close()
    return output.response()


def _parse(schema: type[BaseModel], body: bytes, max_json_depth: int,
           limits: RequestLimits) -> tuple[Any, list[str]]:
    """The body as `schema`, within the request limits (400 otherwise), and the top-level fields it does not
    know. Those are ignored, as vLLM ignores them (clients such as litellm add their own), but never
    silently: the response names them in IGNORED_FIELDS_HEADER and the log warns."""
    data = parse_json(body, max_json_depth)
    req = parse_request(schema, data)
    check_limits(req, limits)
    unknown = sorted(k for k in data if k not in schema.model_fields) if isinstance(data, dict) else []
    return req, unknown


def _field_list(names: list[str], most: int = 16) -> str:
    """Field names for a header and a log line: ASCII (JSON escapes for anything else, control characters
    included, so no header can be split), the first `most` of them."""
    shown = ", ".join(json.dumps(n)[1:-1] for n in names[:most])
    return shown + (f" (and {len(names) - most} more)" if len(names) > most else "")


async def serve_generation(request: Request, schema: type[BaseModel], id_prefix: str, plan: _Plan, *,
                           done_marker: str | None = "[DONE]",
                           error_events: Callable[[Any, dict[str, Any]], list[dict[str, Any]]] | None = None
                           ) -> Response:
    """Serve one generation request. A stream ends with `done_marker` (None: nothing); a failure after its
    first event is OpenAI's error body, or `error_events(output, body)` where the dialect has its own."""
    request_id = request_id_of(request.scope)
    try:
        settings = request.app.state.settings
        body = await read_body(request)
        # Large bodies are parsed and translated (chat template) in worker threads: not on the event loop.
        pool: WorkerPool = request.app.state.prepare
        heavy = len(body) > HEAVY_CHARS
        req, unknown = await pool.call(heavy, _parse, schema, body, settings.max_json_depth, request.app.state.limits)
        headers = None
        if unknown:
            named = _field_list(unknown)
            headers = {IGNORED_FIELDS_HEADER: named}
            log.warning("request %s: ignored unknown fields %s", request_id, named)
        if settings.log_prompts:
            _log_prompt(request_id, req)
        engine = ready_engine(request)
        model, adapter = resolve_model(request, engine, req.model)
        response_id = f"{id_prefix}-{uuid.uuid4().hex}"
        gen_requests, output = await pool.call(heavy, plan, req, response_id, model, adapter, engine.tokenizer)
        stream = GenerationStream(engine, gen_requests, request.app.state.metrics, timeout=settings.request_timeout)
        # Streams wait for the first outputs before answering, so rejections get a real status code; the
        # response then owns the watch.
        with DisconnectWatch(request.receive) as watch:
            if not req.stream:
                return JSONResponse(await watch.until_disconnected(_collect(stream, output)), headers=headers)
            await watch.until_disconnected(stream.start())

            def render_error(exc: BaseException) -> dict[str, Any] | list[dict[str, Any]]:
                log_error(exc, request_id)
                body = openai_error_body(exc, request_id)
                return body if error_events is None else error_events(output, body)

            return sse_response(stream, output.chunks, watch=watch.hand_over(), render_error=render_error,
                                finish=output.final_chunks, on_close=stream.close, done_marker=done_marker,
                                headers=headers)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    except Exception as exc:
        return openai_error_response(exc, request_id)


def _plan_completion(req: CompletionRequest, response_id: str, model: str, adapter: str | None,
                     tokenizer: Tokenizer) -> tuple[list[GenerationRequest], _Output]:
    return (completion_requests(req, response_id, adapter),
            CompletionOutput(req, response_id, model, tokenizer))


def _plan_chat(req: ChatCompletionRequest, response_id: str, model: str, adapter: str | None,
               tokenizer: Tokenizer) -> tuple[list[GenerationRequest], _Output]:
    return ([chat_request(req, response_id, tokenizer, adapter)],
            ChatOutput(req, response_id, model, tokenizer))


async def completions(request: Request) -> Response:
    return await serve_generation(request, CompletionRequest, "cmpl", _plan_completion)


async def chat_completions(request: Request) -> Response:
    return await serve_generation(request, ChatCompletionRequest, "chatcmpl", _plan_chat)


def _model_cards(request: Request) -> list[ModelCard]:
    """The served model, then its LoRA adapters: what GET /v1/models lists (503 while not ready)."""
    engine = ready_engine(request)
    info = engine.model_info
    settings = request.app.state.settings
    created = request.app.state.created
    cards = [ModelCard(id=info.name, created=created, owned_by=OWNED_BY, root=settings.engine.model or info.name,
                       max_model_len=info.context_window)]
    cards += [ModelCard(id=name, created=created, owned_by=OWNED_BY, root=path, parent=info.name,
                        max_model_len=info.context_window)
              for name, path in served_adapters(request, engine).items()]
    return cards


async def list_models(request: Request) -> Response:
    try:
        return JSONResponse(ModelList(data=_model_cards(request)).model_dump())
    except EngineNotReadyError as exc:
        return openai_error_response(exc, request_id_of(request.scope))


async def retrieve_model(request: Request) -> Response:
    """GET /v1/models/{model} (the SDK's models.retrieve): the entry GET /v1/models lists under that id."""
    name = request.path_params["model"]
    try:
        card = next((c for c in _model_cards(request) if c.id == name), None)
        if card is None:
            raise ModelNotFoundError(name, param="model")
        return JSONResponse(card.model_dump())
    except (EngineNotReadyError, ModelNotFoundError) as exc:
        return openai_error_response(exc, request_id_of(request.scope))


def _retrieve_route() -> Route:
    # Ids may hold "/" (a folder-like served name): the path converter matches them whole. `path` is only
    # the template (metrics label, route listing), so it reads as /openapi.json documents it.
    route = Route("/v1/models/{model:path}", retrieve_model, methods=["GET"])
    route.path = "/v1/models/{model}"
    return route


def openai_routes() -> list[BaseRoute]:
    return [
        Route("/v1/models", list_models, methods=["GET"]),
        _retrieve_route(),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]


__all__ = ["openai_routes", "read_body", "read_json", "ready_engine", "resolve_model", "serve_generation"]
