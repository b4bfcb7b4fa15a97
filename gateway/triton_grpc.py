"""KServe v2 gRPC, as Triton serves it on port 8001, with the service definitions tritonclient ships.

    server = await start_grpc_server(app, port)      # by the app's lifespan when --grpc-port is set
    ...
    await server.stop(grace)

Health, metadata, configuration, repository index and statistics answer what the HTTP routes answer
(the same adapters build them). ModelInfer answers a request completely; ModelStreamInfer is
decoupled: requests on one stream run concurrently, each answered by one response per delta (`stream`
true) or per prompt, the last flagged with the parameter `triton_final_response`, as Triton flags it.
A request's failure on a stream is a response carrying `error_message` (the stream stays open), a message
that is no ModelInferRequest too; a unary failure is a gRPC status whose message names the offending input.
The API key is read from the `authorization` metadata (`Bearer <key>`), as HTTP reads the header, and the
per-key limits and charges (gateway.key_limits) hold for ModelInfer and each request of a stream as for
HTTP calls. Each call gets a request id for the logs and server errors, as HTTP requests do: the
`x-request-id` metadata when the client sends one, else a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from starlette.applications import Starlette
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from adapters.triton.metadata import model_metadata, repository_index, server_metadata
from adapters.triton.tensors import (
    Tensor,
    tensor_bytes,
    tensor_from_json,
    tensor_from_raw,
)
from gateway.auth import AuthPolicy, bearer_token
from gateway.errors import RETRY_AFTER_S, error_kind, error_message, log_error
from gateway.key_limits import KeyLimits
from gateway.logs import request_id_var
from gateway.middleware import REQUEST_ID_HEADER
from gateway.triton_infer import (
    InferAnswer,
    InferCall,
    infer_stream,
    infer_unary,
    model_configuration,
    model_statistics,
    resolve_model,
    served_model_names,
    serving,
)
from gateway.triton_stops import Caller
from runtime.errors import InvalidRequestError

log = logging.getLogger("gateway.grpc")

# HTTP status of the error table -> gRPC status code.
_STATUS: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# The typed field of InferTensorContents that holds each datatype (requests without raw contents).
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
             "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
             "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
             "FP64": "fp64_contents", "BYTES": "bytes_contents"}
# The HTTP path whose auth rule a method follows (probes stay public, as on HTTP).
_PUBLIC_METHODS = {"ServerLive": "/v2/health/live", "ServerReady": "/v2/health/ready"}
_SERVICE = "/inference.GRPCInferenceService/"


def status_of(exc: BaseException) -> grpc.StatusCode:
    return _STATUS.get(error_kind(exc).status, grpc.StatusCode.INTERNAL)


def input_tensors(request: pb.ModelInferRequest) -> list[Tensor]:
    """The request's inputs: from raw_input_contents (tritonclient's way) or the typed contents."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InvalidRequestError(f"the request has {len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    tensors = []
    for i, entry in enumerate(request.inputs):
        shape = list(entry.shape)
        if raw:
            tensors.append(tensor_from_raw(entry.name, entry.datatype, shape, raw[i]))
            continue
        field = _CONTENTS.get(entry.datatype)
        if field is None:  # FP16 and others travel raw only; let the codec name the datatype
            tensors.append(tensor_from_raw(entry.name, entry.datatype, shape, b""))
            continue
        values: list[Any] = list(getattr(entry.contents, field))
        if entry.datatype == "BYTES":
            values = [v.decode("utf-8", "surrogateescape") for v in values]
        tensors.append(tensor_from_json(entry.name, entry.datatype, shape, values))
    return tensors


class MalformedRequest(InvalidRequestError):
    """What the deserializer hands over for bytes that are no ModelInferRequest, so that the call can answer
    INVALID_ARGUMENT (unary) or an error response (stream) instead of gRPC's UNKNOWN or a stream that hangs."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(f"the message is not a valid ModelInferRequest: {exc}")


def _lenient(data: bytes) -> pb.ModelInferRequest | MalformedRequest:
    try:
        return pb.ModelInferRequest.FromString(data)
    except DecodeError as exc:
        return MalformedRequest(exc)


def _metadata(pairs: Iterable[tuple[str, str | bytes]] | None) -> list[tuple[bytes, bytes]]:
    """gRPC metadata as HTTP header pairs (bytes)."""
    return [(k.encode(), v.encode() if isinstance(v, str) else v) for k, v in pairs or ()]


def _token(context: grpc.aio.ServicerContext) -> bytes | None:
    """The call's bearer token (`authorization` metadata)."""
    return bearer_token(_metadata(context.invocation_metadata()))


@contextlib.contextmanager
def _logged_as(context: grpc.aio.ServicerContext) -> Iterator[str]:
    """The call's request id (the client's x-request-id, else a fresh one), set for the log lines it writes."""
    given = dict(_metadata(context.invocation_metadata())).get(REQUEST_ID_HEADER.encode())
    request_id = given.decode("latin-1")[:128] if given else uuid.uuid4().hex
    token = request_id_var.set(request_id)
    try:
        yield request_id
    finally:
        request_id_var.reset(token)


def _call(request: pb.ModelInferRequest, caller: Caller) -> InferCall:
    requested = [o.name for o in request.outputs] or None
    return InferCall(request.model_name, request.model_version, request.id, input_tensors(request), requested,
                     caller)


def _response(answer: InferAnswer, final: bool | None = None) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name=answer.model, model_version=answer.version, id=answer.id)
    for tensor in answer.outputs:
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.append(tensor_bytes(tensor))
    if final is not None:
        response.parameters["triton_final_response"].bool_param = final
    return response


class TritonGrpcService(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The GRPCInferenceService over the app's engine and state."""

    def __init__(self, app: Starlette) -> None:
        self.state = app.state

    async def _unary(self, context: grpc.aio.ServicerContext, answer: Callable[[], Awaitable[Any]]) -> Any:
        with _logged_as(context) as request_id:
            try:
                return await answer()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log_error(exc, request_id)
                if status_of(exc) in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                    context.set_trailing_metadata((("retry-after", str(getattr(exc, "retry_after", RETRY_AFTER_S))),))
                await context.abort(status_of(exc), error_message(exc, request_id))

    def _lease(self, context: grpc.aio.ServicerContext) -> contextlib.AbstractContextManager[None]:
        """The call's place in its key's limits (gateway.key_limits, as for HTTP); raises the 429 errors."""
        limits: KeyLimits | None = self.state.key_limits
        if limits is None:
            return contextlib.nullcontext()
        return limits.admit(_token(context))

    def _caller(self, context: grpc.aio.ServicerContext, stream: object = None) -> Caller:
        """Whose requests the call's stop signals may end: its key's, and on a stream that stream's."""
        auth: AuthPolicy = self.state.auth
        return Caller(auth.identity(_token(context)), stream)

    async def ServerLive(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerReadyResponse(ready=serving(self.state))

    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> Any:
        async def answer() -> Any:
            resolve_model(self.state, request.name, request.version)
            return pb.ModelReadyResponse(ready=serving(self.state))
        return await self._unary(context, answer)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext) -> Any:
        return json_format.ParseDict(server_metadata(), pb.ServerMetadataResponse())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext) -> Any:
        async def answer() -> Any:
            model = resolve_model(self.state, request.name, request.version)
            meta = model_metadata(model.name, model.kind, model.version)
            return json_format.ParseDict(meta, pb.ModelMetadataResponse())
        return await self._unary(context, answer)

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext) -> Any:
        async def answer() -> Any:
            config = model_configuration(self.state, resolve_model(self.state, request.name, request.version))
            return json_format.ParseDict({"config": config}, pb.ModelConfigResponse())
        return await self._unary(context, answer)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext) -> Any:
        index = repository_index(served_model_names(self.state), serving(self.state))
        return json_format.ParseDict({"models": index}, pb.RepositoryIndexResponse())

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext) -> Any:
        async def answer() -> Any:
            stats = model_statistics(self.state, request.name, request.version)
            return json_format.ParseDict(stats, pb.ModelStatisticsResponse())
        return await self._unary(context, answer)

    async def ModelInfer(self, request: pb.ModelInferRequest | MalformedRequest,
                         context: grpc.aio.ServicerContext) -> Any:
        async def answer() -> Any:
            if isinstance(request, MalformedRequest):
                raise request
            with self._lease(context):
                return _response(await infer_unary(self.state, _call(request, self._caller(context))))
        return await self._unary(context, answer)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest],
                               context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Every request of the stream runs at once; responses go out as they come."""
        queue: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()
        caller = self._caller(context, stream=object())  # a stop on this stream reaches this stream's requests only

        async def serve(request: pb.ModelInferRequest | MalformedRequest) -> None:
            with _logged_as(context) as request_id:
                try:
                    if isinstance(request, MalformedRequest):
                        raise request
                    with self._lease(context):
                        async for answer in infer_stream(self.state, _call(request, caller)):
                            queue.put_nowait(pb.ModelStreamInferResponse(
                                infer_response=_response(answer, answer.final)))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log_error(exc, request_id)
                    queue.put_nowait(pb.ModelStreamInferResponse(error_message=error_message(exc, request_id)))

        async def read() -> None:
            async for request in request_iterator:
                task = asyncio.create_task(serve(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:  # the client closed its side: finish what runs, then end the stream
                await asyncio.gather(*tasks, return_exceptions=True)
            queue.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (response := await queue.get()) is not None:
                yield response
        finally:  # the client left (or the server stops): abort what still runs
            reader.cancel()
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(reader, *tasks, return_exceptions=True)


class _Auth(grpc.aio.ServerInterceptor):
    """The HTTP API-key policy for gRPC: the key comes from the `authorization` metadata."""

    def __init__(self, policy: AuthPolicy) -> None:
        self.policy = policy

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        method = details.method.removeprefix(_SERVICE)
        token = bearer_token(_metadata(details.invocation_metadata))
        error = self.policy.check(_PUBLIC_METHODS.get(method, "/v2/grpc/" + method), token)
        if error is None:
            return await continuation(details)
        code, message = status_of(error), error_message(error)

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(code, message)

        if method == "ModelStreamInfer":
            return grpc.stream_stream_rpc_method_handler(deny)
        return grpc.unary_unary_rpc_method_handler(deny)


class _Handlers:
    """Stands in for the server while tritonclient's generated code registers the service: keeps its handlers."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.handlers = dict(handlers)


def _add_service(service: TritonGrpcService, server: grpc.aio.Server) -> None:
    """Register the service as tritonclient's generated code does, but with inference requests decoded by
    `_lenient`: a malformed one is answered, where the generated decoder left a stream open for ever."""
    kept = _Handlers()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(service, kept)
    handlers = kept.handlers
    if not handlers:
        raise RuntimeError("tritonclient's generated code no longer registers its handlers as expected")
    encode = pb.ModelInferResponse.SerializeToString
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        service.ModelInfer, request_deserializer=_lenient, response_serializer=encode)
    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        service.ModelStreamInfer, request_deserializer=_lenient,
        response_serializer=pb.ModelStreamInferResponse.SerializeToString)
    name = _SERVICE.strip("/")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


async def start_grpc_server(app: Starlette, port: int, host: str) -> grpc.aio.Server:
    """Serve GRPCInferenceService on host:port; messages up to --max-body-bytes, as HTTP bodies."""
    settings = app.state.settings
    limit = settings.max_body_bytes
    server = grpc.aio.server(interceptors=[_Auth(app.state.auth)],
                             options=[("grpc.max_receive_message_length", limit),
                                      ("grpc.max_send_message_length", max(limit, 64 * 1024 * 1024)),
                                      # several front ends (--api-servers) share the port; else a taken port is an error
                                      ("grpc.so_reuseport", int(settings.api_servers > 1))])
    _add_service(TritonGrpcService(app), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:  # newer grpcio raises where older ones returned 0
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {address} (is the port taken?): pass another port with --grpc-port N "
                      "(`make serve GRPC_PORT=N`), or --grpc-port none to serve no gRPC")
    await server.start()
    log.info("KServe v2 gRPC on %s", address)
    return server


__all__ = ["TritonGrpcService", "start_grpc_server"]
