"""KServe v2 HTTP `infer` bodies: JSON tensors and Triton's binary tensor data extension.

A binary request is a JSON header of `Inference-Header-Content-Length` bytes, then the raw data of
every input whose `parameters.binary_data_size` is set, in input order (what tritonclient.http sends by
default). An output is answered in binary when its request entry says `binary_data: true`, or when
no outputs are listed and the request's `binary_data_output` is true (tritonclient.http's default);
the response is then a JSON header plus the outputs' raw data, with the same header naming its length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from adapters.triton.tensors import Tensor, tensor_bytes, tensor_from_json, tensor_from_raw, tensor_json_data
from runtime.errors import InvalidRequestError

HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass
class HttpInfer:
    """A parsed infer body."""

    id: str
    tensors: list[Tensor]
    requested: list[str] | None  # output names listed; None: all
    binary: dict[str, bool] = field(default_factory=dict)  # per listed output: answer in binary
    binary_default: bool = False  # for outputs when none are listed


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{what} must be a JSON object", param=what)
    return value


def _input(entry: Any, binary: bytes, offset: int) -> tuple[Tensor, int]:
    """One input tensor; the offset of the binary data after it."""
    entry = _object(entry, "inputs")
    name = entry.get("name")
    if not isinstance(name, str):
        raise InvalidRequestError("every input needs a 'name'", param="inputs")
    datatype, shape = entry.get("datatype"), entry.get("shape")
    size = _object(entry.get("parameters"), f"input '{name}' parameters").get("binary_data_size")
    if size is None:
        if "data" not in entry:
            raise InvalidRequestError(f"input '{name}' has neither 'data' nor binary data", param=name)
        return tensor_from_json(name, datatype, shape, entry["data"]), offset
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
        raise InvalidRequestError(f"input '{name}': binary_data_size {size!r} runs past the request body", param=name)
    return tensor_from_raw(name, datatype, shape, binary[offset:offset + size]), offset + size


def parse_http_infer(header: Any, binary: bytes = b"") -> HttpInfer:
    """The infer request in `header` (decoded JSON) with `binary` (the bytes after the JSON header)."""
    body = _object(header, "the request body")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidRequestError("the request needs a non-empty 'inputs' list", param="inputs")
    tensors: list[Tensor] = []
    offset = 0
    for entry in inputs:
        tensor, offset = _input(entry, binary, offset)
        tensors.append(tensor)
    if offset != len(binary):
        raise InvalidRequestError(f"the request has {len(binary) - offset} bytes of binary data no input claims")
    request_id = body.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidRequestError("'id' must be a string", param="id")
    params = _object(body.get("parameters"), "parameters")
    parsed = HttpInfer(request_id, tensors, None, binary_default=params.get("binary_data_output") is True)
    outputs = body.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise InvalidRequestError("'outputs' must be a list", param="outputs")
        parsed.requested = []
        for entry in outputs:
            entry = _object(entry, "outputs")
            name = entry.get("name")
            if not isinstance(name, str):
                raise InvalidRequestError("every requested output needs a 'name'", param="outputs")
            parsed.requested.append(name)
            out_params = _object(entry.get("parameters"), f"output '{name}' parameters")
            parsed.binary[name] = out_params.get("binary_data", parsed.binary_default) is True
    return parsed


def render_http_infer(request: HttpInfer, model: str, version: str, outputs: list[Tensor]) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary data follows it (else None)."""
    entries: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for tensor in outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if request.binary.get(tensor.name, request.binary_default):
            blob = tensor_bytes(tensor)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = tensor_json_data(tensor)
        entries.append(entry)
    body: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": entries}
    if request.id:
        body["id"] = request.id
    header = orjson.dumps(body)
    if not blobs:
        return header, None
    return header + b"".join(blobs), len(header)


def split_http_body(raw: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """(JSON header, binary data) of a request body, per its Inference-Header-Content-Length header."""
    if header_length is None:
        return raw, b""
    try:
        n = int(header_length)
    except ValueError:
        n = -1
    if not 0 <= n <= len(raw):
        raise InvalidRequestError(f"{HEADER_LENGTH} {header_length!r} is not within the body's {len(raw)} bytes")
    return raw[:n], raw[n:]
