"""adapters/triton/tensors.py: KServe v2 tensors from JSON and raw bytes, checked against tritonclient's own
serialisation (the bytes a real client sends)."""

from __future__ import annotations

import numpy as np
import pytest

from adapters.triton.tensors import output_tensor, tensor_bytes, tensor_from_json, tensor_from_raw, tensor_json_data
from runtime.errors import InvalidRequestError

utils = pytest.importorskip("tritonclient.utils")


@pytest.mark.parametrize("array", [
    np.array([[1, 2, 3]], dtype=np.int32),
    np.array([[2**64 - 1]], dtype=np.uint64),
    np.array([[7]], dtype=np.uint32),
    np.array([[0.5, -1.25]], dtype=np.float16),
    np.array([[True, False]]),
    np.array([["héllo", ""], ["a", "b"]]).astype(object),
])
def test_raw_round_trip_matches_tritonclient(array: np.ndarray) -> None:
    datatype = utils.np_to_triton_dtype(array.dtype)
    raw = utils.serialize_byte_tensor(array).item() if datatype == "BYTES" else array.tobytes()
    tensor = tensor_from_raw("x", datatype, list(array.shape), raw)
    expected = np.vectorize(lambda s: s.encode())(array) if datatype == "BYTES" else array
    assert tensor.shape == list(array.shape) and (tensor.array == expected).all()
    assert tensor_bytes(tensor) == raw


def test_json_tensors_nested_or_flat() -> None:
    assert tensor_from_json("ids", "INT32", [1, 3], [[1, 2, 3]]).array.tolist() == [[1, 2, 3]]
    assert tensor_from_json("ids", "INT32", [1, 3], [1, 2, 3]).array.tolist() == [[1, 2, 3]]
    text = tensor_from_json("t", "BYTES", [1, 1], ["hi"])
    assert text.array.tolist() == [[b"hi"]] and tensor_json_data(text) == ["hi"]


@pytest.mark.parametrize("datatype,shape,data,message", [
    ("INT32", [1, 2], [1], "input 'x' has 1 elements but its shape [1, 2] needs 2"),
    ("INT32", [1, 1], [1.5], "input 'x' of datatype INT32 must hold integers"),
    ("INT8", [1], [300], "input 'x' holds a value that is not INT8"),
    ("BOOL", [1], [1], "input 'x' of datatype BOOL must hold booleans"),
    ("BYTES", [1], [3], "input 'x' of datatype BYTES must hold strings"),
    ("BF17", [1], [3], "input 'x' has datatype 'BF17'; expected one of BOOL"),
    ("FP32", [-1], [3], "input 'x' must have a shape of non-negative integers"),
    (["BYTES"], [1], ["a"], "input 'x' has datatype ['BYTES']; expected one of BOOL"),  # these two were 500s
    ({"a": 1}, [1], ["a"], "input 'x' has datatype {'a': 1}; expected one of BOOL"),
])
def test_bad_json_tensors_name_the_input(datatype: str, shape: list[int], data: list, message: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        tensor_from_json("x", datatype, shape, data)
    assert str(err.value.message).startswith(message) and err.value.param == "x"


@pytest.mark.parametrize("datatype,raw,message", [
    ("INT32", b"\x01\x00", "input 'x' has 2 bytes of data but its shape [1] of INT32 needs 4"),
    ("BYTES", b"\x05\x00\x00\x00ab", "input 'x': a BYTES element runs past the end of the data"),
    ("BYTES", b"\x01\x00", "input 'x': truncated BYTES element length"),
])
def test_bad_raw_tensors_name_the_input(datatype: str, raw: bytes, message: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        tensor_from_raw("x", datatype, [1], raw)
    assert err.value.message == message


def test_output_tensor_shapes_values() -> None:
    text = output_tensor("text_output", "BYTES", [2], ["a", "é"])
    assert text.array.tolist() == [b"a", "é".encode()]
    ids = output_tensor("output_ids", "INT32", [1, 1, 3], [4, 5, 6])
    assert ids.array.dtype == np.int32 and ids.shape == [1, 1, 3]
