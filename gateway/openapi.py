"""GET /openapi.json: an OpenAPI 3.1 document generated from the models and tables the routes really use.

OpenAI routes: request bodies are the schemas the routes validate with (adapters.openai.requests,
.responses_request), responses the schemas they serialise (adapters.openai.responses, .responses_objects),
errors OpenAI's error object.
Triton routes (gateway.openapi_triton): bodies from the input tables the generate route parses with,
errors Triton's `{"error": "..."}`. LoRA load/unload: vLLM's bodies, plain-text answers. Generating it
from the code keeps the document and the code from drifting; tests/e2e/test_fuzz_openapi.py fuzzes
the server against it.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from adapters.openai.requests import ChatCompletionRequest, CompletionRequest
from adapters.openai.responses import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from adapters.openai.responses_objects import (
    ResponseDeleted,
    ResponseObject,
    ResponseStreamEvent,
)
from adapters.openai.responses_request import ResponsesRequest
from gateway.openapi_triton import sse_events, triton_paths, triton_schemas

_REF = "#/components/schemas/{model}"
_MODELS: list[type[BaseModel]] = [CompletionRequest, ChatCompletionRequest, Completion, ChatCompletion,
                                  ChatCompletionChunk, ModelList, ModelCard, ErrorResponse, ResponsesRequest,
                                  ResponseObject, ResponseStreamEvent, ResponseDeleted]

# Statuses the error table (gateway/errors.py) can produce on each kind of route.
_ERRORS = {
    "400": "Malformed JSON, an invalid or unsupported field (`param` names it), or prompt + max_tokens over the "
           "context window.",
    "401": "Missing or wrong API key.",
    "403": "A valid key without the rights for this route.",
    "404": "Unknown model (or adapter), unknown response id (never stored, deleted or expired), or a disabled "
           "route.",
    "413": "Request body over --max-body-bytes.",
    "429": "The request queue is full, or the API key is over its --key-max-concurrency or "
           "--key-tokens-per-minute (see Retry-After).",
    "500": "The engine failed while serving this request (the message holds the request id).",
    "503": "The model is loading, the server is draining, or the engine died (see Retry-After).",
    "504": "The request ran past --request-timeout.",
}
_GET_ERRORS = ("401", "503")
_GET_MODEL_ERRORS = ("401", "404", "503")
_POST_ERRORS = tuple(_ERRORS)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "required": True,
                                "schema": {"type": "string", "pattern": "^[1-9][0-9]*$"}}}


def _errors(codes: tuple[str, ...], schema: str = ErrorResponse.__name__) -> dict[str, Any]:
    body = {"application/json": {"schema": {"$ref": _REF.format(model=schema)}}}
    return {code: {"description": _ERRORS[code], "content": body,
                   **({"headers": _RETRY_AFTER} if code in ("429", "503") else {})} for code in codes}


def _lora(summary: str, fields: dict[str, str]) -> dict[str, Any]:
    body = {"type": "object", "required": list(fields),
            "properties": {name: {"type": "string", "minLength": 1, "pattern": r"\S", "description": doc}
                           for name, doc in fields.items()}}
    return {"post": {
        "summary": summary + " (admin; off unless --enable-lora-loading, then 404)",
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {"200": {"description": "vLLM's success line, e.g. `Success: LoRA adapter 'sql' added "
                                             "successfully.`",
                              "content": {"text/plain": {"schema": {"type": "string"}}}},
                      **_errors(("400", "401", "403", "404", "413", "500", "503"))},
    }}


def _generate(summary: str, request: type[BaseModel], response: type[BaseModel],
              chunk: type[BaseModel]) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {
            "200": {"description": "The result; with `stream: true`, Server-Sent Events of chunks ending in "
                                   "`data: [DONE]`; a failure after the first chunk is an error event.",
                    "content": {"application/json": {"schema": _ref(response)},
                                **sse_events({"anyOf": [_ref(chunk), _ref(ErrorResponse)]}, done_marker="[DONE]")}},
            **_errors(_POST_ERRORS),
        },
    }}


_ITEM_LIST = {"type": "object", "required": ["object", "data", "first_id", "last_id", "has_more"], "properties": {
    "object": {"const": "list"}, "has_more": {"type": "boolean"},
    "data": {"type": "array", "items": {"type": "object", "required": ["id", "type"],
                                        "properties": {"id": {"type": "string"}, "type": {"type": "string"}}}},
    "first_id": {"type": ["string", "null"]}, "last_id": {"type": ["string", "null"]}}}


def _responses() -> dict[str, Any]:
    """POST /v1/responses, GET/DELETE of a stored response, and its input items."""
    response = {"application/json": {"schema": _ref(ResponseObject)}}
    stored = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    pages = [{"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
             {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
             {"name": "after", "in": "query", "schema": {"type": "string"}},
             {"name": "include", "in": "query", "schema": {"type": "array", "items": {"type": "string"}}}]
    return {
        "/v1/responses": {"post": {
            "summary": "Response (OpenAI's Responses API)",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(ResponsesRequest)}}},
            "responses": {"200": {"description": "The response; with `stream: true`, Server-Sent Events of typed "
                                                 "events (no end marker); a failure after the first event is an "
                                                 "error event, then response.failed.",
                                  "content": {**response, **sse_events(_ref(ResponseStreamEvent))}},
                          **_errors(_POST_ERRORS)}}},
        "/v1/responses/{response_id}": {
            "get": {"summary": "A stored response", "parameters": stored,
                    "responses": {"200": {"description": "The response", "content": response},
                                  **_errors(_GET_MODEL_ERRORS)}},
            "delete": {"summary": "Delete a stored response", "parameters": stored,
                       "responses": {"200": {"description": "Deleted", "content": {
                           "application/json": {"schema": _ref(ResponseDeleted)}}},
                           **_errors(_GET_MODEL_ERRORS)}}},
        "/v1/responses/{response_id}/input_items": {"get": {
            "summary": "The items a stored response was generated from (its conversation), one page",
            "parameters": [*stored, *pages],
            "responses": {"200": {"description": "A page of items", "content": {
                "application/json": {"schema": _ITEM_LIST}}}, **_errors(("400", *_GET_MODEL_ERRORS))}}},
    }


def openapi_document(title: str = "trtllm-gateway", version: str = "0.1.0") -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route: OpenAI, LoRA admin, Triton and operational."""
    _, schemas = models_json_schema([(m, "validation") for m in _MODELS], ref_template=_REF)
    text = {"text/plain": {"schema": {"type": "string"}}}
    health = {"application/json": {"schema": {"type": "object", "properties": {
        "status": {"enum": ["ready", "loading", "draining", "failed"]}, "error": {"type": "string"}},
        "required": ["status"]}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version,
                 "description": "OpenAI- and Triton-compatible API over an in-process LLM runtime."},
        "components": {
            "schemas": {**schemas.get("$defs", {}), **triton_schemas()},
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
        # Keys are optional: only servers started with --api-key require one.
        "security": [{}, {"bearerAuth": []}],
        "paths": {
            "/v1/models": {"get": {"summary": "The served model and its LoRA adapters", "responses": {
                "200": {"description": "Model list", "content": {"application/json": {"schema": _ref(ModelList)}}},
                **_errors(_GET_ERRORS)}}},
            "/v1/models/{model}": {"get": {
                "summary": "One entry of /v1/models: the served model or a LoRA adapter",
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"},
                                "description": "A model id as /v1/models lists it (it may contain '/')."}],
                "responses": {
                    "200": {"description": "The model", "content": {"application/json": {"schema": _ref(ModelCard)}}},
                    **_errors(_GET_MODEL_ERRORS)}}},
            "/v1/completions": _generate("Text completion", CompletionRequest, Completion, Completion),
            "/v1/chat/completions": _generate("Chat completion", ChatCompletionRequest, ChatCompletion,
                                               ChatCompletionChunk),
            **_responses(),
            "/v1/load_lora_adapter": _lora("Load a LoRA adapter", {
                "lora_name": "The name requests use as `model`.",
                "lora_path": "A PEFT adapter folder, inside one of --lora-root when given (relative: from there)."}),
            "/v1/unload_lora_adapter": _lora("Unload a LoRA adapter", {"lora_name": "A loaded adapter's name."}),
            **triton_paths(_errors),
            "/health": {"get": {"summary": "Readiness", "security": [{}], "responses": {
                "200": {"description": "Ready", "content": health},
                "503": {"description": "Loading, draining or failed", "content": health}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "security": [{}], "responses": {
                "200": {"description": "Text exposition format", "content": text}}}},
        },
    }


async def openapi_json(request: Request) -> Response:
    return JSONResponse(_cached_document())


@functools.lru_cache(maxsize=1)
def _cached_document() -> dict[str, Any]:
    return openapi_document()


def openapi_routes() -> list[BaseRoute]:
    return [Route("/openapi.json", openapi_json, methods=["GET"], include_in_schema=False)]
