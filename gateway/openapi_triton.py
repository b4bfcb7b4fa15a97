"""The Triton routes' part of /openapi.json, generated from the tables the routes parse with.

Request bodies come from adapters.triton.inputs (one property per supported input, with the JSON
types `coerce` accepts), responses from the output tables; errors are Triton's `{"error": "..."}`.
Text models (the served name, `ensemble`, `tensorrt_llm_bls`) and the token-id model `tensorrt_llm`
get one operation each.
"""

from __future__ import annotations

from typing import Any

from adapters.triton.generate import IDS_MODEL_NAME, TEXT_MODEL_NAMES
from adapters.triton.inputs import IDS_MODEL_INPUTS, TEXT_MODEL_INPUTS, InputSpec, Kind

REF = "#/components/schemas/{model}"
VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string", "enum": ["1"]},
           "description": "Only version 1 exists; any other is a 404."}

_INT32 = {"type": "integer", "minimum": -2**31, "maximum": 2**31 - 1}
_UINT64 = {"type": "integer", "minimum": 0, "maximum": 2**64 - 1}
_NUMBERS = {"type": "array", "items": {"type": "number"}}
_SCALARS: dict[Kind, dict[str, Any]] = {"str": {"type": "string"}, "int": _INT32, "uint64": _UINT64,
                                        "float": {"type": "number"}, "bool": {"type": "boolean"}}
# Value ranges adapters.triton.generate checks (a value outside is a 400 naming the input).
_RANGES: dict[str, dict[str, Any]] = {
    "max_tokens": {"minimum": 1}, "request_output_len": {"minimum": 1}, "top_k": {"minimum": 0},
    "runtime_top_k": {"minimum": 0}, "top_p": {"minimum": 0, "maximum": 1},
    "runtime_top_p": {"minimum": 0, "maximum": 1},
    "temperature": {"minimum": 0}, "min_length": {"minimum": 0}, "beam_width": {"minimum": 1},
    "num_return_sequences": {"minimum": 1}, "end_id": {"minimum": -1}, "num_draft_tokens": {"minimum": 0},
    "guided_decoding_guide_type": {"enum": ["json", "json_schema", "regex", "ebnf_grammar"]},
}


def _one_or_list(item: dict[str, Any], batch: bool = False) -> dict[str, Any]:
    """A [1]-shaped tensor: the value, or a list holding it (several values only for a batch)."""
    return {"anyOf": [item, {"type": "array", "items": item, "minItems": 1, **({} if batch else {"maxItems": 1})}]}


def input_schema(kind: Kind, name: str = "") -> dict[str, Any]:
    """The JSON values adapters.triton.inputs.coerce accepts for one input kind (and the range of `name`)."""
    if kind in _SCALARS:
        return _one_or_list({**_SCALARS[kind], **_RANGES.get(name, {})})
    ids = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    shapes: dict[str, dict[str, Any]] = {
        "text": _one_or_list({"type": "string", "minLength": 1}, batch=True),  # one prompt, or a batch
        "ids": {"anyOf": [ids, {"type": "array", "items": ids, "minItems": 1}]},
        "lengths": _one_or_list({"type": "integer", "minimum": 0}, batch=True),
        "words": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "floats": {"anyOf": [{"type": "number"}, _NUMBERS]},
        "ints2d": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "floats2d": {"type": "array", "items": _NUMBERS},
    }
    return shapes[kind]


def _request_schema(specs: tuple[InputSpec, ...], title: str) -> dict[str, Any]:
    supported = [s for s in specs if s.supported]
    props: dict[str, Any] = {}
    for spec in supported:
        aliases = f"; also accepted as {', '.join(spec.aliases)}" if spec.aliases else ""
        props[spec.name] = {**input_schema(spec.kind, spec.name),
                            "description": f"{spec.datatype} {list(spec.dims)}{aliases}"}
    return {"title": title, "type": "object", "additionalProperties": False,
            "description": "Inputs at top level; Triton clients may also put any of them in a `parameters` "
                           "object (each input once in all). Other names are a 400.",
            "properties": {**props, "id": {"type": "string"}},
            "required": [s.name for s in supported if s.required]}


def _response_schema(first: dict[str, Any], title: str) -> dict[str, Any]:
    one_or_many = {"anyOf": [{"type": "number"}, _NUMBERS]}
    props = {"model_name": {"type": "string"}, "model_version": {"type": "string"}, **first,
             "cum_log_probs": one_or_many, "output_log_probs": one_or_many, "context_logits": one_or_many,
             "generation_logits": one_or_many, "batch_index": {"type": "integer"},
             "sequence_index": {"type": "integer"}, "sequence_start": {"type": "boolean"},
             "sequence_end": {"type": "boolean"}, "sequence_id": {"type": "integer"}}
    return {"title": title, "type": "object", "properties": props,
            "required": ["model_name", "model_version", *first]}


def triton_schemas() -> dict[str, Any]:
    """Component schemas of the Triton routes."""
    ints = {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}}]}
    text_out = _response_schema({"text_output": {"anyOf": [{"type": "string"},
                                                           {"type": "array", "items": {"type": "string"}}]}},
                                "TritonTextResponse")
    ids_out = _response_schema({"output_ids": ints, "sequence_length": ints}, "TritonIdsResponse")
    tensor = {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
        "name": {"type": "string"}, "datatype": {"type": "string"}, "shape": {"type": "array",
                                                                               "items": {"type": "integer"}}}}
    return {
        "TritonError": {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"],
                        "additionalProperties": False},
        "TritonTextRequest": _request_schema(TEXT_MODEL_INPUTS, "TritonTextRequest"),
        "TritonIdsRequest": _request_schema(IDS_MODEL_INPUTS, "TritonIdsRequest"),
        "TritonTextResponse": text_out,
        "TritonIdsResponse": ids_out,
        "TritonServerMetadata": {"type": "object", "required": ["name", "version", "extensions"], "properties": {
            "name": {"type": "string"}, "version": {"type": "string"},
            "extensions": {"type": "array", "items": {"type": "string"}}}},
        "TritonModelMetadata": {"type": "object", "required": ["name", "versions", "platform", "inputs", "outputs"],
                                "properties": {"name": {"type": "string"},
                                               "versions": {"type": "array", "items": {"type": "string"}},
                                               "platform": {"type": "string"},
                                               "inputs": {"type": "array", "items": tensor},
                                               "outputs": {"type": "array", "items": tensor}}},
        "TritonModelReady": {"type": "object", "required": ["name", "ready"], "properties": {
            "name": {"type": "string"}, "ready": {"type": "boolean"}}},
        "TritonModelConfig": {"type": "object", "required": ["name", "platform", "backend", "max_batch_size",
                                                             "input", "output"]},
    }


def sse_events(payload: dict[str, Any], done_marker: str | None = None) -> dict[str, Any]:
    """A text/event-stream media type whose every event's `data` is JSON matching `payload` (OpenAPI 3.1
    reads `schema` as one event's), except a final `done_marker` event such as OpenAI's `[DONE]`."""
    data: dict[str, Any] = {"type": "string", "contentMediaType": "application/json", "contentSchema": payload}
    if done_marker is not None:
        data = {"type": "string", "if": {"const": done_marker}, "else": data}
    return {"text/event-stream": {"schema": {"type": "object", "required": ["data"], "properties": {"data": data}}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


def _json(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(name)}}


_PHASE = {"type": "object", "required": ["count", "ns"],
          "properties": {"count": {"type": "integer"}, "ns": {"type": "integer"}}}
_STATISTICS = {"application/json": {"schema": {
    "type": "object", "required": ["model_stats"], "properties": {"model_stats": {"type": "array", "items": {
        "type": "object", "required": ["name", "version", "last_inference", "inference_count", "execution_count",
                                       "inference_stats"],
        "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                       "last_inference": {"type": "integer", "description": "ms since the epoch; 0: none yet"},
                       "inference_count": {"type": "integer"}, "execution_count": {"type": "integer"},
                       "inference_stats": {"type": "object", "additionalProperties": _PHASE},
                       "batch_stats": {"type": "array"}}}}}}}}
_REPOSITORY_INDEX = {"application/json": {"schema": {"type": "array", "items": {
    "type": "object", "required": ["name", "version", "state"],
    "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                   "state": {"type": "string", "enum": ["READY", "UNAVAILABLE"]}}}}}}


_DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
              "FP64", "BYTES"]
_TENSOR_PARAMETERS = {"type": "object", "properties": {
    "binary_data_size": {"type": "integer", "minimum": 0,
                         "description": "this tensor's bytes follow the JSON header (binary tensor data extension)"},
    "binary_data": {"type": "boolean", "description": "answer this output in binary"}}}
_INFER_REQUEST = {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["inputs"], "properties": {
        "id": {"type": "string", "description": "echoed; a stop signal names the request to end by it"},
        "parameters": {"type": "object", "properties": {"binary_data_output": {"type": "boolean"}}},
        "inputs": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["name", "shape", "datatype"], "properties": {
                "name": {"type": "string"}, "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "datatype": {"type": "string", "enum": _DATATYPES}, "parameters": _TENSOR_PARAMETERS,
                "data": {"type": "array", "description": "flat or nested, row-major"}}}},
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "parameters": _TENSOR_PARAMETERS}}}}}}},
    "description": "JSON, or with the binary tensor data extension: a JSON header of "
                   "Inference-Header-Content-Length bytes, then the inputs' raw data"}
_INFER_RESPONSE = {"application/json": {"schema": {
    "type": "object", "required": ["model_name", "model_version", "outputs"], "properties": {
        "model_name": {"type": "string"}, "model_version": {"type": "string"}, "id": {"type": "string"},
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name", "datatype", "shape"],
                                               "properties": {"name": {"type": "string"},
                                                              "datatype": {"type": "string", "enum": _DATATYPES},
                                                              "shape": {"type": "array", "items": {"type": "integer"}},
                                                              "data": {"type": "array"},
                                                              "parameters": _TENSOR_PARAMETERS}}}}}}}


def _model_param(ids: bool) -> list[dict[str, Any]]:
    if ids:
        return []
    return [{"name": "model", "in": "path", "required": True,
             "schema": {"type": "string", "enum": list(TEXT_MODEL_NAMES)},
             "description": "A text model: `ensemble`, `tensorrt_llm_bls` or the served model name; an unknown "
                            "name is a 404."}]


def triton_paths(errors: Any) -> dict[str, Any]:
    """Paths of the Triton routes; `errors(codes, schema)` renders the error responses."""
    paths: dict[str, Any] = {
        "/v2": {"get": {"summary": "Server metadata (KServe v2)", "responses": {
            "200": {"description": "Server metadata", "content": _json("TritonServerMetadata")},
            **errors(("401",), "TritonError")}}},
        "/v2/repository/index": {"post": {"summary": "Every model, its version and state (Triton's repository "
                                                    "extension; the body is ignored)", "responses": {
            "200": {"description": "The models", "content": _REPOSITORY_INDEX}, **errors(("401",), "TritonError")}}},
        "/v2/models/stats": {"get": {"summary": "Every model's inference statistics (Triton's statistics "
                                                "extension)", "responses": {
            "200": {"description": "Statistics", "content": _STATISTICS}, **errors(("401",), "TritonError")}}},
        # Public by default (--public-paths), like /health: Kubernetes probes carry no key.
        "/v2/health/live": {"get": {"summary": "Liveness: 200 while the process serves HTTP", "security": [{}],
                                    "responses": {"200": {"description": "Live (empty body)"}}}},
        "/v2/health/ready": {"get": {"summary": "Readiness, as Triton answers it", "security": [{}], "responses": {
            "200": {"description": "Ready (empty body)"},
            "400": {"description": "Not ready: loading, draining or failed (empty body)"}}}},
    }
    for ids in (False, True):
        base = f"/v2/models/{IDS_MODEL_NAME}" if ids else "/v2/models/{model}"
        for prefix, extra in ((base, []), (base + "/versions/{version}", [VERSION])):
            params = _model_param(ids) + extra
            paths.update(_model_paths(prefix, params, ids, errors))
    return paths


def _model_paths(prefix: str, params: list[dict[str, Any]], ids: bool, errors: Any) -> dict[str, Any]:
    kind = "Ids" if ids else "Text"
    what = "token ids in, token ids out" if ids else "text in, text out"
    ok = {"anyOf": [_ref(f"Triton{kind}Response"), {"type": "array", "items": _ref(f"Triton{kind}Response")}]}
    body = {"required": True, "content": _json(f"Triton{kind}Request")}
    post_errors = errors(("400", "401", "404", "413", "429", "500", "503", "504"), "TritonError")
    get_errors = errors(("401", "404"), "TritonError")

    def op(summary: str, responses: dict[str, Any], post: bool = False) -> dict[str, Any]:
        operation: dict[str, Any] = {"summary": summary, "responses": responses}
        if params:
            operation["parameters"] = params
        if post:
            operation["requestBody"] = body
        return operation

    return {
        prefix + "/generate": {"post": op(f"Generate ({what}); a batch of prompts answers a list", {
            "200": {"description": "One object, or one per prompt (with batch_index) for a batch",
                    "content": {"application/json": {"schema": ok}}}, **post_errors}, post=True)},
        prefix + "/generate_stream": {"post": op(f"Generate as Server-Sent Events ({what})", {
            "200": {"description": "`data: {...}` events; a failure after the first event is an event "
                                   "`{\"error\": \"...\"}`",
                    "content": sse_events({"anyOf": [_ref(f"Triton{kind}Response"), _ref("TritonError")]})},
            **post_errors}, post=True)},
        prefix + "/infer": {"post": {**op(f"KServe v2 inference ({what}): typed tensors with a batch dimension", {
            "200": {"description": "The output tensors; a batch's rows stacked (binary: JSON header, then data)",
                    "content": _INFER_RESPONSE}, **post_errors}), "requestBody": _INFER_REQUEST}},
        prefix: {"get": op("Model metadata (KServe v2)", {
            "200": {"description": "Inputs and outputs", "content": _json("TritonModelMetadata")}, **get_errors})},
        prefix + "/ready": {"get": op("Model readiness", {
            "200": {"description": "Ready", "content": _json("TritonModelReady")},
            "400": {"description": "Not ready", "content": _json("TritonModelReady")}, **get_errors})},
        prefix + "/config": {"get": op("Model configuration, shaped like the backend's config.pbtxt", {
            "200": {"description": "Configuration", "content": _json("TritonModelConfig")}, **get_errors})},
        prefix + "/stats": {"get": op("Inference statistics (Triton's statistics extension)", {
            "200": {"description": "Statistics", "content": _STATISTICS}, **get_errors})},
    }
