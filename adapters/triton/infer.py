"""KServe v2 `infer` (HTTP and gRPC) for the backend's models: input tensors -> the generate path's
runtime requests; output tensors -> the tensors of each response.

Inputs carry the batch dimension first, as the backend's clients send them (`[[prompt]]`, `[[16]]`).
The prompt inputs (`text_input`, `input_ids`, `input_lengths`) give one runtime request per row; every
other input is shared by the batch, so its rows must agree. The tensors become the same values a
generate body holds and go through `parse_generate`, so both dialects reach the engine identically.

A stop signal is the backend's: a request whose `stop` input is true ends the running requests that
carry the same request id (tensorrt_llm's `inflight_batcher_llm_client.py --stop-after-ms`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from adapters.triton.generate import TritonGenerate, parse_generate
from adapters.triton.inputs import ModelKind, output_specs, specs_by_name
from adapters.triton.outputs import OutputTensor
from adapters.triton.tensors import Tensor, output_tensor
from adapters.limits import RequestLimits
from runtime.errors import InvalidRequestError
from runtime.tokenizer import Tokenizer

def is_stop_signal(tensors: list[Tensor]) -> bool:
    """True for the backend's stop request (a true `stop` input)."""
    return any(t.name == "stop" and t.datatype == "BOOL" and bool(t.array.any()) for t in tensors)


def _text(tensor: Tensor, values: Any) -> Any:
    """BYTES elements as text (nested like `values`)."""
    if isinstance(values, list):
        return [_text(tensor, v) for v in values]
    try:
        return values.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequestError(f"input '{tensor.name}' is not valid UTF-8", param=tensor.name) from None


def _value(tensor: Tensor, kind: str | None) -> Any:
    """The generate-body value of one input tensor (`kind`: its InputSpec kind; None: unknown name)."""
    array = tensor.array
    if kind in ("text", "lengths"):
        array = array.reshape(-1)  # one value per row
    elif kind != "ids" and array.ndim >= 2:
        if any(not np.array_equal(array[i], array[0]) for i in range(1, array.shape[0])):
            raise InvalidRequestError(
                f"input '{tensor.name}' differs between the rows of the batch; send such rows as separate requests",
                param=tensor.name)
        array = array[0]  # the batch's shared value
    values = array.tolist()
    return _text(tensor, values) if tensor.datatype == "BYTES" else values


def infer_body(tensors: list[Tensor], kind: ModelKind) -> dict[str, Any]:
    """{input name: generate-body value} of the input tensors (names are checked by read_inputs)."""
    specs = specs_by_name(kind)
    body: dict[str, Any] = {}
    for tensor in tensors:
        if tensor.name in body:
            raise InvalidRequestError(f"input '{tensor.name}' is given twice", param=tensor.name)
        spec = specs.get(tensor.name)
        body[tensor.name] = _value(tensor, spec.kind if spec is not None else None)
    body.pop("stop", None)  # false: an ordinary request (true is a stop signal, handled before)
    return body


def parse_infer(tensors: list[Tensor], *, model_name: str, model_version: str, kind: ModelKind,
                tokenizer: Tokenizer, request_id: str, limits: RequestLimits = RequestLimits(),
                exclude_input_default: bool = False) -> TritonGenerate:
    """Validate an infer request's input tensors and build its runtime requests (InvalidRequestError: 400)."""
    return parse_generate(infer_body(tensors, kind), model_name=model_name, model_version=model_version, kind=kind,
                          tokenizer=tokenizer, request_id=request_id, limits=limits,
                          exclude_input_default=exclude_input_default)


def check_requested_outputs(names: list[str], kind: ModelKind, model_name: str) -> None:
    """400 naming an output the model does not have."""
    known = {name for name, _, _ in output_specs(kind)}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InvalidRequestError(f"unexpected inference output '{unknown[0]}' for model '{model_name}'",
                                  param=unknown[0])


def select_outputs(gen: TritonGenerate, outputs: list[OutputTensor], requested: list[str] | None) -> list[Tensor]:
    """The response's tensors: the requested ones, in request order, else all (batch_index only for a batch)."""
    by_name = {name: (datatype, shape, values) for name, datatype, shape, values in outputs}
    if requested is None:
        names = [n for n in by_name if n != "batch_index" or gen.batched]
    else:
        names = [n for n in requested if n in by_name]
    return [output_tensor(n, *by_name[n]) for n in names]


def stack_outputs(responses: list[list[Tensor]]) -> list[Tensor]:
    """One response of a whole batch: each output's rows concatenated on the batch dimension, inner dims
    padded to the longest (zeros; empty bytes for text)."""
    if len(responses) == 1:
        return responses[0]
    stacked: list[Tensor] = []
    for column in zip(*responses):
        first = column[0]
        arrays = [t.array for t in column]
        ndim = max(a.ndim for a in arrays)
        arrays = [a.reshape(a.shape + (1,) * (ndim - a.ndim)) for a in arrays]
        inner = [max(a.shape[d] for a in arrays) for d in range(1, ndim)]
        fill: Any = b"" if first.datatype == "BYTES" else 0
        padded = [np.pad(a, [(0, 0)] + [(0, w - s) for w, s in zip(inner, a.shape[1:])], constant_values=fill)
                  if list(a.shape[1:]) != inner else a for a in arrays]
        stacked.append(Tensor(first.name, first.datatype, np.concatenate(padded, axis=0)))
    return stacked
