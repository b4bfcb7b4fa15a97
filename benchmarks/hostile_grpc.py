"""KServe gRPC on a raw channel, as bytes of our own making (for benchmarks.hostile and benchmarks.soak): calls,
the hostile mix (messages that are no ModelInferRequest, schemas that are no schema, empty batches, stop signals
that name nobody) and the small request the prober sends.

    async with grpc.aio.insecure_channel("127.0.0.1:8001") as channel:
        status = await GRPC_HOSTILE["grpc_malformed_stream"](channel)    # "OK", "INVALID_ARGUMENT", ...

A status in SERVER_ERRORS is gRPC's 5xx: the run fails on any.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

SERVICE = "/inference.GRPCInferenceService/"
SERVER_ERRORS = frozenset({"INTERNAL", "UNKNOWN", "UNAVAILABLE", "DATA_LOSS", "UNIMPLEMENTED", "DEADLINE_EXCEEDED"})
TIMEOUT_S = 300.0
_RAW = {"request_serializer": lambda b: b, "response_deserializer": lambda b: b}


def infer_request(inputs: dict[str, Any], request_id: str = "", model: str = "ensemble") -> bytes:
    """A serialized ModelInferRequest: each input a [1, 1] tensor of its value's type (an array keeps its own
    shape), with raw contents as tritonclient sends them."""
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    for name, value in inputs.items():
        array = value if isinstance(value, np.ndarray) else np.array([[value]], dtype=object if isinstance(
            value, str) else bool if isinstance(value, bool) else np.int32)
        if array.dtype == object:
            datatype, raw = "BYTES", b"".join(struct.pack("<I", len(v.encode())) + v.encode() for v in array.flat)
        else:
            datatype, raw = {"bool": "BOOL", "int32": "INT32"}[array.dtype.name], array.tobytes()
        request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        request.raw_input_contents.append(raw)
    return request.SerializeToString()


async def call_unary(channel: grpc.aio.Channel, message: bytes) -> pb.ModelInferResponse:
    """ModelInfer (grpc.aio.AioRpcError when it fails)."""
    data = await channel.unary_unary(SERVICE + "ModelInfer", **_RAW)(message, timeout=TIMEOUT_S)
    return pb.ModelInferResponse.FromString(data)


async def call_stream(channel: grpc.aio.Channel, messages: list[bytes]) -> list[pb.ModelStreamInferResponse]:
    """Every response of a ModelStreamInfer of `messages`, once the server ends it (grpc.aio.AioRpcError when it
    fails)."""
    call = channel.stream_stream(SERVICE + "ModelStreamInfer", **_RAW)(iter(messages), timeout=TIMEOUT_S)
    return [pb.ModelStreamInferResponse.FromString(data) async for data in call]


async def unary(channel: grpc.aio.Channel, message: bytes) -> str:
    """ModelInfer's status name."""
    try:
        await call_unary(channel, message)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    return "OK"


async def stream(channel: grpc.aio.Channel, messages: list[bytes]) -> str:
    """A ModelStreamInfer of `messages`: "OK" once the server ends it (its responses may carry error messages,
    Triton's way of failing one request of a stream), else the status it ended with."""
    try:
        responses = await call_stream(channel, messages)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    return "OK (error response)" if any(r.error_message for r in responses) else "OK"


GRPC_HOSTILE: dict[str, Callable[[grpc.aio.Channel], Awaitable[str]]] = {
    "grpc_malformed_stream": lambda ch: stream(ch, [b"\xff\xff\xff not protobuf"]),  # hung for ever before
    "grpc_malformed_unary": lambda ch: unary(ch, b"\xff\xff\xff not protobuf"),
    "grpc_guided_not_a_schema": lambda ch: unary(ch, infer_request(  # ended the engine core before
        {"text_input": "x", "max_tokens": 2, "guided_decoding": "1"})),
    "grpc_guided_100k_brackets": lambda ch: unary(ch, infer_request(
        {"text_input": "x", "max_tokens": 2, "guided_decoding": "[" * 100_000})),
    "grpc_empty_batch": lambda ch: unary(ch, infer_request(
        {"text_input": np.empty((0, 1), dtype=object), "max_tokens": np.empty((0, 1), dtype=np.int32)})),
    "grpc_stop_of_nobody": lambda ch: stream(ch, [infer_request(  # the empty id: it stopped every id-less request
        {"input_ids": np.empty((1, 1), dtype=np.int32), "input_lengths": 0, "request_output_len": 0, "stop": True},
        model="tensorrt_llm")]),
}


async def small_infer(channel: grpc.aio.Channel) -> None:
    """The prober's gRPC request: one token through ModelInfer (RuntimeError when it fails)."""
    status = await unary(channel, infer_request({"text_input": "import", "max_tokens": 1}))
    if status != "OK":
        raise RuntimeError(f"a small gRPC request failed with {status}")
