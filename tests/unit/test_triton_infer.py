"""adapters/triton/infer.py and http_infer.py: infer tensors -> the generate path's runtime requests, stop
signals, requested outputs, batch stacking, and HTTP bodies with JSON and binary tensors."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest

from adapters.triton.http_infer import parse_http_infer, render_http_infer, split_http_body
from adapters.triton.infer import check_requested_outputs, is_stop_signal, parse_infer, select_outputs, \
    stack_outputs
from adapters.triton.outputs import PromptResult, complete_outputs
from adapters.triton.tensors import Tensor, output_tensor, tensor_bytes
from runtime.errors import InvalidRequestError
from runtime.request import OutputDelta
from runtime.tokenizer import Tokenizer


def t(name: str, array: np.ndarray, datatype: str) -> Tensor:
    return Tensor(name, datatype, array)


def text(*prompts: str) -> Tensor:
    array = np.empty((len(prompts), 1), dtype=object)
    array[:, 0] = [p.encode() for p in prompts]
    return t("text_input", array, "BYTES")


def test_text_tensors_become_the_generate_requests(tokenizer: Tokenizer) -> None:
    tensors = [text("hello"), t("max_tokens", np.array([[5]], np.int32), "INT32"),
               t("temperature", np.array([[0.5]], np.float32), "FP32"), t("top_k", np.array([[3]], np.uint32), "UINT32"),
               t("random_seed", np.array([[2**63]], np.uint64), "UINT64"), t("stream", np.array([[True]]), "BOOL")]
    gen = parse_infer(tensors, model_name="ensemble", model_version="1", kind="text", tokenizer=tokenizer,
                      request_id="r")
    (req,) = gen.requests
    assert req.prompt == "hello" and not gen.batched and gen.stream is True
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.top_k, s.seed) == (5, 0.5, 3, 2**63)


def test_a_batch_gives_one_request_per_row_with_shared_options(tokenizer: Tokenizer) -> None:
    tensors = [text("a", "b"), t("max_tokens", np.array([[4], [4]], np.int32), "INT32")]
    gen = parse_infer(tensors, model_name="ensemble", model_version="1", kind="text", tokenizer=tokenizer,
                      request_id="r")
    assert [r.prompt for r in gen.requests] == ["a", "b"] and gen.batched
    differing = [text("a", "b"), t("max_tokens", np.array([[4], [5]], np.int32), "INT32")]
    with pytest.raises(InvalidRequestError, match="input 'max_tokens' differs between the rows"):
        parse_infer(differing, model_name="ensemble", model_version="1", kind="text", tokenizer=tokenizer,
                    request_id="r")


def test_ids_model_rows_are_cut_to_input_lengths(tokenizer: Tokenizer) -> None:
    tensors = [t("input_ids", np.array([[5, 6, 7], [8, 9, 0]], np.int32), "INT32"),
               t("input_lengths", np.array([[3], [2]], np.int32), "INT32"),
               t("request_output_len", np.array([[2], [2]], np.uint32), "UINT32"),
               t("stop", np.array([[False], [False]]), "BOOL")]
    gen = parse_infer(tensors, model_name="tensorrt_llm", model_version="1", kind="ids", tokenizer=tokenizer,
                      request_id="r")
    assert [r.prompt_token_ids for r in gen.requests] == [[5, 6, 7], [8, 9]]
    assert not is_stop_signal(tensors)
    assert is_stop_signal([t("stop", np.array([[True]]), "BOOL")])


def test_wrong_dtypes_and_unknown_inputs_are_named(tokenizer: Tokenizer) -> None:
    def parse(*extra: Tensor) -> None:
        parse_infer([text("x"), *extra], model_name="ensemble", model_version="1", kind="text",
                    tokenizer=tokenizer, request_id="r")

    with pytest.raises(InvalidRequestError, match="input 'max_tokens' must be a 32-bit integer, got the number 2.5"):
        parse(t("max_tokens", np.array([[2.5]], np.float32), "FP32"))
    with pytest.raises(InvalidRequestError, match="unexpected inference input 'nope'"):
        parse(t("max_tokens", np.array([[2]], np.int32), "INT32"), t("nope", np.array([[1]], np.int32), "INT32"))
    with pytest.raises(InvalidRequestError, match="input 'text_input' is not valid UTF-8"):
        parse_infer([t("text_input", np.array([[b"\xff"]], dtype=object), "BYTES"),
                     t("max_tokens", np.array([[2]], np.int32), "INT32")], model_name="ensemble",
                    model_version="1", kind="text", tokenizer=tokenizer, request_id="r")
    with pytest.raises(InvalidRequestError, match="unexpected inference output 'logits'"):
        check_requested_outputs(["text_output", "logits"], "text", "ensemble")
    # an empty batch (was an IndexError: a 500, INTERNAL over gRPC)
    with pytest.raises(InvalidRequestError, match=r"input 'text_input' has shape \[0, 1\]: its first dimension is "
                                                  "the batch size, which must be at least 1"):
        parse_infer([t("text_input", np.empty((0, 1), dtype=object), "BYTES"),
                     t("max_tokens", np.empty((0, 1), np.int32), "INT32")], model_name="ensemble",
                    model_version="1", kind="text", tokenizer=tokenizer, request_id="r")


def test_outputs_are_selected_and_a_batch_is_stacked(tokenizer: Tokenizer) -> None:
    tensors = [t("input_ids", np.array([[5, 6], [8, 9]], np.int32), "INT32"),
               t("input_lengths", np.array([[2], [1]], np.int32), "INT32"),
               t("request_output_len", np.array([[3], [3]], np.int32), "INT32")]
    gen = parse_infer(tensors, model_name="tensorrt_llm", model_version="1", kind="ids", tokenizer=tokenizer,
                      request_id="r")
    results = [PromptResult(), PromptResult()]
    results[0].add(OutputDelta(request_id="r-0", token_ids=[1, 2, 3], finish_reason="length"))
    results[1].add(OutputDelta(request_id="r-1", token_ids=[4], finish_reason="stop"))
    rows = [select_outputs(gen, outputs, None) for outputs in complete_outputs(gen, results)]
    names = [o.name for o in rows[0]]
    assert names == ["output_ids", "sequence_length", "cum_log_probs", "output_log_probs", "batch_index"]
    stacked = {o.name: o.array for o in stack_outputs(rows)}
    assert stacked["output_ids"].tolist() == [[[5, 6, 1, 2, 3]], [[8, 4, 0, 0, 0]]]  # padded with pad_id 0
    assert stacked["sequence_length"].tolist() == [[5], [2]]
    assert stacked["batch_index"].tolist() == [[0], [1]]
    only = select_outputs(gen, complete_outputs(gen, results)[0], ["sequence_length"])
    assert [o.name for o in only] == ["sequence_length"]


def test_http_body_with_binary_inputs_and_outputs() -> None:
    ids = np.array([[1, 2]], np.int32)
    header = {"id": "9", "inputs": [
        {"name": "input_ids", "datatype": "INT32", "shape": [1, 2], "parameters": {"binary_data_size": 8}},
        {"name": "request_output_len", "datatype": "INT32", "shape": [1, 1], "data": [[3]]}],
        "outputs": [{"name": "output_ids", "parameters": {"binary_data": True}}, {"name": "sequence_length"}]}
    head = orjson.dumps(header)
    json_part, binary = split_http_body(head + ids.tobytes(), str(len(head)))
    parsed = parse_http_infer(json.loads(json_part), binary)
    assert parsed.id == "9" and [x.array.tolist() for x in parsed.tensors] == [[[1, 2]], [[3]]]
    assert parsed.requested == ["output_ids", "sequence_length"]
    out = [output_tensor("output_ids", "INT32", [1, 1, 2], [7, 8]), output_tensor("sequence_length", "INT32", [1, 1], [2])]
    body, length = render_http_infer(parsed, "tensorrt_llm", "1", out)
    response = json.loads(body[:length])
    assert response["outputs"][0] == {"name": "output_ids", "datatype": "INT32", "shape": [1, 1, 2],
                                      "parameters": {"binary_data_size": 8}}
    assert response["outputs"][1]["data"] == [2] and response["id"] == "9"
    assert body[length:] == tensor_bytes(out[0])


@pytest.mark.parametrize("header,binary,message", [
    ({"inputs": []}, b"", "the request needs a non-empty 'inputs' list"),
    ({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1]}]}, b"", "input 'x' has neither 'data' nor binary"),
    ({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "parameters": {"binary_data_size": 8}}]}, b"1234",
     "input 'x': binary_data_size 8 runs past the request body"),
    ({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}]}, b"12",
     "the request has 2 bytes of binary data no input claims"),
])
def test_bad_http_bodies(header: dict, binary: bytes, message: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        parse_http_infer(header, binary)
    assert err.value.message.startswith(message)
    with pytest.raises(InvalidRequestError, match="Inference-Header-Content-Length '99'"):
        split_http_body(b"{}", "99")
