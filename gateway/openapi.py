"""GET /openapi.json: an OpenAPI 3.1 document generated from the pydantic models the routes really use.

Request bodies are the schemas the routes validate with (adapters.openai.requests), responses the
schemas they serialise (adapters.openai.responses), errors OpenAI's error object. Generating it from
the models keeps the document and the code from drifting; tests/e2e/test_fuzz_openapi.py fuzzes the
server against it. (The Triton routes follow the KServe generate extension's own documentation.)
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
from adapters.openai.responses import ChatCompletion, Completion, ErrorResponse, ModelList

_REF = "#/components/schemas/{model}"
_MODELS: list[type[BaseModel]] = [CompletionRequest, ChatCompletionRequest, Completion, ChatCompletion, ModelList,
                                  ErrorResponse]

# Statuses the error table (gateway/errors.py) can produce on each kind of route.
_ERRORS = {
    "400": "Malformed JSON, an invalid or unsupported field (`param` names it), or prompt + max_tokens over the "
           "context window.",
    "401": "Missing or wrong API key.",
    "403": "A valid key without the rights for this route.",
    "404": "Unknown model.",
    "413": "Request body over --max-body-bytes.",
    "429": "The request queue is full (see Retry-After).",
    "500": "The engine failed while serving this request (the message holds the request id).",
    "503": "The model is loading, the server is draining, or the engine died (see Retry-After).",
    "504": "The request ran past --request-timeout.",
}
_GET_ERRORS = ("401", "503")
_POST_ERRORS = tuple(_ERRORS)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _errors(codes: tuple[str, ...]) -> dict[str, Any]:
    body = {"application/json": {"schema": _ref(ErrorResponse)}}
    return {code: {"description": _ERRORS[code], "content": body} for code in codes}


def _generate(summary: str, request: type[BaseModel], response: type[BaseModel]) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {
            "200": {"description": "The result; with `stream: true`, Server-Sent Events of chunks ending in "
                                   "`data: [DONE]`.",
                    "content": {"application/json": {"schema": _ref(response)},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **_errors(_POST_ERRORS),
        },
    }}


def openapi_document(title: str = "trtllm-gateway", version: str = "0.1.0") -> dict[str, Any]:
    """The OpenAPI 3.1 document of the OpenAI and operational routes."""
    _, schemas = models_json_schema([(m, "validation") for m in _MODELS], ref_template=_REF)
    text = {"text/plain": {"schema": {"type": "string"}}}
    health = {"application/json": {"schema": {"type": "object", "properties": {
        "status": {"enum": ["ready", "loading", "draining", "failed"]}, "error": {"type": "string"}},
        "required": ["status"]}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version,
                 "description": "OpenAI-compatible API over an in-process LLM runtime."},
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
        # Keys are optional: only servers started with --api-key require one.
        "security": [{}, {"bearerAuth": []}],
        "paths": {
            "/v1/models": {"get": {"summary": "The served model and its LoRA adapters", "responses": {
                "200": {"description": "Model list", "content": {"application/json": {"schema": _ref(ModelList)}}},
                **_errors(_GET_ERRORS)}}},
            "/v1/completions": _generate("Text completion", CompletionRequest, Completion),
            "/v1/chat/completions": _generate("Chat completion", ChatCompletionRequest, ChatCompletion),
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
