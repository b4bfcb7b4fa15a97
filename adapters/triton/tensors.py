"""KServe v2 tensors: typed n-dimensional arrays as the HTTP (JSON and binary) and gRPC protocols carry them.

    t = tensor_from_json("max_tokens", "INT32", [1, 1], [16])     # HTTP JSON "data"
    t = tensor_from_raw("input_ids", "INT32", [1, 3], raw)        # HTTP binary extension / gRPC raw contents
    raw = tensor_bytes(t)                                          # the inverse, for responses

Raw data is little-endian, row-major; a BYTES element is a 4-byte little-endian length and then its
bytes (the layout tritonclient writes). Every check raises InvalidRequestError naming the tensor.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.errors import InvalidRequestError, brief

# KServe datatype -> little-endian numpy dtype (BYTES: Python bytes objects).
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}


@dataclass
class Tensor:
    """One named tensor; `array` has exactly `shape` (BYTES elements are `bytes`)."""

    name: str
    datatype: str
    array: np.ndarray

    @property
    def shape(self) -> list[int]:
        return list(self.array.shape)


def _checked_shape(name: str, datatype: str, shape: Any) -> tuple[tuple[int, ...], int]:
    if not isinstance(datatype, str) or datatype not in DTYPES:
        raise InvalidRequestError(
            f"input '{name}' has datatype {_brief(datatype)}; expected one of {', '.join(DTYPES)}", param=name)
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                       for d in shape):
        raise InvalidRequestError(f"input '{name}' must have a shape of non-negative integers, got {shape!r}",
                                  param=name)
    return tuple(shape), math.prod(shape)


def _brief(value: Any) -> str:
    """`value` as quoted in an error: short, whatever was sent."""
    return brief(f"'{value}'" if isinstance(value, str) else repr(value), 40)


def _flat_json(name: str, data: Any) -> list[Any]:
    """JSON tensor data, nested or flat, as one flat list (Triton accepts both)."""
    if not isinstance(data, list):
        return [data]
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:  # iterative: a deeply nested body cannot exhaust the recursion limit
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def tensor_from_json(name: str, datatype: str, shape: Any, data: Any) -> Tensor:
    """A tensor from HTTP JSON: `data` is a flat or nested list of JSON values (BYTES: strings)."""
    dims, count = _checked_shape(name, datatype, shape)
    flat = _flat_json(name, data)
    if len(flat) != count:
        raise InvalidRequestError(
            f"input '{name}' has {len(flat)} elements but its shape {list(dims)} needs {count}", param=name)
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise InvalidRequestError(f"input '{name}' of datatype BYTES must hold strings", param=name)
        array = np.empty(count, dtype=object)
        array[:] = [v.encode("utf-8", "surrogatepass") for v in flat]
        return Tensor(name, datatype, array.reshape(dims))
    if datatype == "BOOL":
        ok, kind = all(isinstance(v, bool) for v in flat), "booleans"
    elif datatype.startswith("FP"):
        ok, kind = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat), "numbers"
    else:
        ok, kind = all(isinstance(v, int) and not isinstance(v, bool) for v in flat), "integers"
    if not ok:
        raise InvalidRequestError(f"input '{name}' of datatype {datatype} must hold {kind}", param=name)
    try:
        array = np.array(flat, dtype=DTYPES[datatype])
    except (OverflowError, ValueError) as exc:
        raise InvalidRequestError(f"input '{name}' holds a value that is not {datatype}: {exc}", param=name) from None
    return Tensor(name, datatype, array.reshape(dims))


def tensor_from_raw(name: str, datatype: str, shape: Any, raw: bytes) -> Tensor:
    """A tensor from raw bytes (the HTTP binary extension, gRPC `raw_input_contents`)."""
    dims, count = _checked_shape(name, datatype, shape)
    if datatype == "BYTES":
        elements = _split_bytes(name, raw)
        if len(elements) != count:
            raise InvalidRequestError(
                f"input '{name}' has {len(elements)} elements but its shape {list(dims)} needs {count}", param=name)
        array = np.empty(count, dtype=object)
        array[:] = elements
        return Tensor(name, datatype, array.reshape(dims))
    dtype = DTYPES[datatype]
    if len(raw) != count * dtype.itemsize:
        raise InvalidRequestError(
            f"input '{name}' has {len(raw)} bytes of data but its shape {list(dims)} of {datatype} needs "
            f"{count * dtype.itemsize}", param=name)
    return Tensor(name, datatype, np.frombuffer(raw, dtype=dtype).reshape(dims))


def _split_bytes(name: str, raw: bytes) -> list[bytes]:
    out: list[bytes] = []
    pos = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise InvalidRequestError(f"input '{name}': truncated BYTES element length", param=name)
        (size,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + size > len(raw):
            raise InvalidRequestError(f"input '{name}': a BYTES element runs past the end of the data", param=name)
        out.append(bytes(raw[pos:pos + size]))
        pos += size
    return out


def tensor_bytes(tensor: Tensor) -> bytes:
    """The raw little-endian bytes of a tensor (BYTES: length-prefixed elements)."""
    if tensor.datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in tensor.array.reshape(-1))
    return np.ascontiguousarray(tensor.array, dtype=DTYPES[tensor.datatype]).tobytes()


def tensor_json_data(tensor: Tensor) -> list[Any]:
    """A tensor's elements as a flat JSON list (BYTES as text, as Triton writes them)."""
    flat = tensor.array.reshape(-1)
    if tensor.datatype == "BYTES":
        return [v.decode("utf-8", "replace") for v in flat]
    return flat.tolist()


def output_tensor(name: str, datatype: str, shape: list[int], values: list[Any]) -> Tensor:
    """An output tensor from flat Python values (BYTES values: str or bytes)."""
    if datatype == "BYTES":
        array = np.empty(len(values), dtype=object)
        array[:] = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
    else:
        array = np.asarray(values, dtype=DTYPES[datatype])
    return Tensor(name, datatype, array.reshape(shape))
