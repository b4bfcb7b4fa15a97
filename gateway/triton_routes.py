"""Triton routes: the generate extension and the KServe v2 endpoints beside it.

    from gateway.triton_routes import triton_routes     # list[BaseRoute], mounted by create_app

- POST /v2/models/{model}[/versions/{v}]/generate: one JSON object; a batch of prompts (text_input a
  list) is answered with a JSON list holding one object per prompt, each with `batch_index` (the
  backend answered a batch as several batch-size-1 responses; /generate has one body to put them in).
- POST .../generate_stream: Server-Sent Events. With `stream: true`, one event per engine delta (new
  text only); otherwise one event per prompt holding its complete answer, as the backend's
  non-streaming mode did over the same endpoint. A failure after the first event is an event
  `{"error": "..."}`; one before it is a plain JSON error with its status.
- POST .../infer: KServe v2 inference (JSON tensors or the binary tensor data extension), through
  gateway.triton_infer as gRPC's ModelInfer; a batch's rows are stacked in one response.
- GET /v2, /v2/health/live, /v2/health/ready, /v2/models/{model}[/versions/{v}], .../ready, .../config,
  .../stats; POST /v2/repository/index.

Model names: the served model name, `ensemble`, `tensorrt_llm_bls` (text in, text out),
`tensorrt_llm` (token ids in, token ids out), the served LoRA adapters (text), and the tokenizer steps
`preprocessing` and `postprocessing` (infer only); version "1" only.
Errors use Triton's `{"error": "..."}` through gateway.errors; an unknown model or version is a 404.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from adapters.triton import (
    ResponseCollector,
    StreamRenderer,
    TritonGenerate,
    parse_generate,
)
from adapters.triton.http_infer import (
    HEADER_LENGTH,
    parse_http_infer,
    render_http_infer,
    split_http_body,
)
from adapters.triton.inputs import ModelKind
from adapters.triton.metadata import (
    model_metadata,
    model_ready,
    repository_index,
    server_metadata,
)
from adapters.triton.tokenizer_models import TOKENIZER_MODELS
from gateway.auth import bearer_token
from gateway.disconnect import DisconnectWatch, until_disconnected
from gateway.errors import (
    ClientDisconnected,
    ModelNotFoundError,
    log_error,
    triton_error_body,
    triton_error_response,
)
from gateway.generation import GenerationStream
from gateway.limits import parse_json
from gateway.middleware import request_id_of
from gateway.openai_routes import read_body, ready_engine
from gateway.streaming import sse_response
from gateway.triton_infer import (
    InferCall,
    TritonModel,
    apply_adapter,
    infer_unary,
    inference_timer,
    model_configuration,
    model_statistics,
    resolve_model,
    served_model_names,
    serving,
)
from gateway.triton_metrics import InferenceTimer
from gateway.triton_stops import Caller
from runtime.errors import InvalidRequestError
from runtime.request import OutputDelta
from runtime.tokenizer import Tokenizer
from runtime.workers import HEAVY_CHARS, WorkerPool

CLIENT_CLOSED = 499  # nginx's "client closed request": counted, never seen by the gone client


def _resolve(request: Request) -> TritonModel:
    """The model of the path; UnknownModelError (404) for names and versions we do not serve."""
    return resolve_model(request.app.state, request.path_params["model"], request.path_params.get("version", ""))


def _parse(request: Request, raw: bytes, name: str, version: str, kind: ModelKind,
           tokenizer: Tokenizer) -> TritonGenerate:
    """The generate body (shared size and depth limits; parse errors worded for Triton clients) as
    runtime requests."""
    settings = request.app.state.settings
    body = parse_json(raw, settings.max_json_depth, lambda exc: f"failed to parse the request JSON buffer: {exc}")
    return parse_generate(body, model_name=name, model_version=version, kind=kind, tokenizer=tokenizer,
                          request_id=f"triton-{uuid.uuid4().hex}", limits=request.app.state.limits,
                          exclude_input_default=bool(settings.exclude_input_in_output))


class _Timed:
    """The stream's items, booking the last output and the outcome on `timer`. It keeps the stream's
    `batches()`, so the SSE writer sends the deltas that were ready together in one send (as on the
    OpenAI routes) instead of one send per delta."""

    def __init__(self, stream: GenerationStream, timer: InferenceTimer | None) -> None:
        self._stream = stream
        self._timer = timer

    async def batches(self) -> AsyncIterator[list[tuple[int, OutputDelta]]]:
        ok = False
        try:
            async for batch in self._stream.batches():
                yield batch
            ok = True
        finally:
            if self._timer is not None:
                self._timer.outputs_done()
                self._timer.finish(ok)

    async def __aiter__(self) -> AsyncIterator[tuple[int, OutputDelta]]:
        async for batch in self.batches():
            for item in batch:
                yield item


async def _collect(stream: GenerationStream, gen: TritonGenerate, timer: InferenceTimer | None) -> Any:
    collector = ResponseCollector(gen)
    try:
        async for item in _Timed(stream, timer):
            collector(item)
    finally:
        stream.close()
    responses = collector.responses()
    return responses if gen.batched or len(responses) > 1 else responses[0]


async def _generate(request: Request, streaming: bool) -> Response:
    request_id = request_id_of(request.scope)
    timer: InferenceTimer | None = None
    try:
        model = _resolve(request)
        if model.kind in TOKENIZER_MODELS:  # the backend's tokenizer models are not decoupled LLM models either
            raise InvalidRequestError(f"model '{model.name}' answers KServe infer requests "
                                      f"(POST /v2/models/{model.name}/infer), not generate")
        timer = inference_timer(request.app.state, model)
        raw = await read_body(request)
        engine = ready_engine(request)
        # Large bodies are parsed (and their words tokenized) in worker threads: not on the event loop.
        pool: WorkerPool = request.app.state.prepare
        gen = await pool.call(len(raw) > HEAVY_CHARS, _parse, request, raw, model.name, model.version, model.kind,
                              engine.tokenizer)
        apply_adapter(model, gen.requests)
        for req in gen.requests:  # only generate_stream with `stream: true` sends deltas as they come
            req.stream = streaming and bool(gen.stream)
        if timer is not None:
            timer.batch_size = len(gen.requests)
            timer.inputs_done()
        settings = request.app.state.settings
        stream = GenerationStream(engine, gen.requests, request.app.state.metrics, timeout=settings.request_timeout)
        # Wait for the first outputs before answering, so rejections get a real status code. A stream's
        # response then owns the watch.
        with DisconnectWatch(request.receive) as watch:
            await watch.until_disconnected(stream.start())
            if timer is not None:
                timer.first_output()
            if not streaming:
                return JSONResponse(await watch.until_disconnected(_collect(stream, gen, timer)))
            return _stream_response(stream, gen, timer, request_id, watch.hand_over())
    except ClientDisconnected:
        if timer is not None:
            timer.finish(ok=False)
        return Response(status_code=CLIENT_CLOSED)
    except Exception as exc:
        if timer is not None:
            timer.finish(ok=False)
        return triton_error_response(exc, request_id)


def _stream_response(stream: GenerationStream, gen: TritonGenerate, timer: InferenceTimer | None,
                     request_id: str, watch: DisconnectWatch) -> Response:
    def render_error(exc: BaseException) -> dict[str, Any]:
        log_error(exc, request_id)
        return triton_error_body(exc, request_id)

    def on_close() -> None:
        stream.close()
        if timer is not None:  # a disconnect mid-stream: the request did not complete
            timer.finish(ok=False)

    if gen.stream:
        return sse_response(_Timed(stream, timer), StreamRenderer(gen), watch=watch, render_error=render_error,
                            on_close=on_close)
    collector = ResponseCollector(gen)  # non-streaming mode: the complete answers, one event each
    return sse_response(_Timed(stream, timer), collector, watch=watch, render_error=render_error,
                        finish=collector.responses, on_close=on_close)


async def generate(request: Request) -> Response:
    return await _generate(request, streaming=False)


async def generate_stream(request: Request) -> Response:
    return await _generate(request, streaming=True)


async def infer(request: Request) -> Response:
    """POST .../infer: KServe v2 inference with JSON tensors or the binary tensor data extension."""
    request_id = request_id_of(request.scope)
    try:
        raw = await read_body(request)
        header, binary = split_http_body(raw, request.headers.get(HEADER_LENGTH))
        settings = request.app.state.settings
        body = parse_json(header, settings.max_json_depth,
                          lambda exc: f"failed to parse the request JSON buffer: {exc}")
        parsed = parse_http_infer(body, binary)
        caller = Caller(request.app.state.auth.identity(bearer_token(request.scope["headers"])))
        call = InferCall(request.path_params["model"], request.path_params.get("version", ""), parsed.id,
                         parsed.tensors, parsed.requested, caller)
        answer = await until_disconnected(request.receive, infer_unary(request.app.state, call))
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    except Exception as exc:
        return triton_error_response(exc, request_id)
    content, header_length = render_http_infer(parsed, answer.model, answer.version, answer.outputs)
    if header_length is None:
        return Response(content, media_type="application/json")
    return Response(content, media_type="application/octet-stream", headers={HEADER_LENGTH: str(header_length)})


# ---- KServe v2 -----------------------------------------------------------------------------------
async def server_info(request: Request) -> Response:
    return JSONResponse(server_metadata())


async def health_live(request: Request) -> Response:
    """200 while the process serves HTTP (the engine may still be loading)."""
    return Response(status_code=200)


async def health_ready(request: Request) -> Response:
    """200 once the engine serves; 400 otherwise, as Triton answers its readiness probe."""
    return Response(status_code=200 if serving(request.app.state) else 400)


async def model_info(request: Request) -> Response:
    try:
        model = _resolve(request)
    except ModelNotFoundError as exc:
        return triton_error_response(exc, request_id_of(request.scope))
    return JSONResponse(model_metadata(model.name, model.kind, model.version))


async def model_ready_route(request: Request) -> Response:
    try:
        model = _resolve(request)
    except ModelNotFoundError as exc:
        return triton_error_response(exc, request_id_of(request.scope))
    ready = serving(request.app.state)
    return JSONResponse(model_ready(ready, model.name), status_code=200 if ready else 400)


async def model_config_route(request: Request) -> Response:
    try:
        model = _resolve(request)
    except ModelNotFoundError as exc:
        return triton_error_response(exc, request_id_of(request.scope))
    return JSONResponse(model_configuration(request.app.state, model))


async def repository_index_route(request: Request) -> Response:
    return JSONResponse(repository_index(served_model_names(request.app.state), serving(request.app.state)))


async def statistics_route(request: Request) -> Response:
    """Every model's statistics (GET /v2/models/stats), or one model's."""
    try:
        stats = model_statistics(request.app.state, request.path_params.get("model", ""),
                                 request.path_params.get("version", ""))
    except ModelNotFoundError as exc:
        return triton_error_response(exc, request_id_of(request.scope))
    return JSONResponse(stats)


def _model_routes() -> list[BaseRoute]:
    routes: list[BaseRoute] = []
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [
            Route(prefix + "/generate", generate, methods=["POST"]),
            Route(prefix + "/generate_stream", generate_stream, methods=["POST"]),
            Route(prefix + "/infer", infer, methods=["POST"]),
            Route(prefix + "/ready", model_ready_route, methods=["GET"]),
            Route(prefix + "/config", model_config_route, methods=["GET"]),
            Route(prefix + "/stats", statistics_route, methods=["GET"]),
            Route(prefix, model_info, methods=["GET"]),
        ]
    return routes


triton_routes: list[BaseRoute] = [
    Route("/v2", server_info, methods=["GET"]),
    Route("/v2/health/live", health_live, methods=["GET"]),
    Route("/v2/health/ready", health_ready, methods=["GET"]),
    Route("/v2/repository/index", repository_index_route, methods=["POST"]),
    Route("/v2/models/stats", statistics_route, methods=["GET"]),  # before /v2/models/{model} takes "stats"
    *_model_routes(),
]

__all__ = ["triton_routes"]
