"""OpenAI Responses API routes: POST /v1/responses, GET and DELETE /v1/responses/{response_id}, and
GET /v1/responses/{response_id}/input_items (adapters/openai/responses_input_items.py).

POST takes the chat route's path (`serve_generation`): the request becomes the equivalent chat request
over the conversation (adapters/openai/responses_input.py) and the deltas become Responses events or one
response object (adapters/openai/responses_output.py). With `store` (the default) the finished response
is kept in app.state.responses (gateway/response_store.py) for GET and for `previous_response_id`.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from adapters.limits import RequestLimits, over_limit
from adapters.openai.responses_input import output_items, responses_request
from adapters.openai.responses_input_items import input_item_list, with_ids
from adapters.openai.responses_objects import ResponseDeleted
from adapters.openai.responses_output import ResponsesOutput
from adapters.openai.responses_request import InputItem, ResponsesRequest
from gateway.errors import ResponseNotFoundError, openai_error_response
from gateway.middleware import request_id_of
from gateway.openai_routes import serve_generation
from gateway.response_store import ResponseStore, StoredResponse
from runtime.request import GenerationRequest
from runtime.tokenizer import Tokenizer


def _history(store: ResponseStore, previous_response_id: str | None) -> list[InputItem]:
    """The conversation `previous_response_id` continues (404 naming the field when it is not stored)."""
    if previous_response_id is None:
        return []
    entry = store.get(previous_response_id)
    if entry is None:
        raise ResponseNotFoundError(previous_response_id, param="previous_response_id")
    return entry.items


class _Plan:
    """serve_generation's plan for one request: the conversation, the engine request, the output builder
    (which stores the finished response when the request says `store`)."""

    def __init__(self, store: ResponseStore, limits: RequestLimits) -> None:
        self._store = store
        self._limits = limits

    def __call__(self, req: ResponsesRequest, response_id: str, model: str, adapter: str | None,
                 tokenizer: Tokenizer) -> tuple[list[GenerationRequest], ResponsesOutput]:
        items = with_ids([*_history(self._store, req.previous_response_id), *req.input])
        if len(items) > self._limits.max_messages:  # the chat template renders them all
            raise over_limit("input", "number of items (with those of previous responses)", len(items),
                             self._limits.max_messages)

        def keep(response: dict[str, Any]) -> None:
            self._store.put(response["id"], StoredResponse(response, [*items, *output_items(response["output"])]))

        output = ResponsesOutput(req, response_id, model, tokenizer, on_done=keep if req.store else None)
        return [responses_request(req, items, response_id, tokenizer, adapter)], output


async def create_response(request: Request) -> Response:
    state = request.app.state
    return await serve_generation(request, ResponsesRequest, "resp", _Plan(state.responses, state.limits),
                                  done_marker=None, error_events=ResponsesOutput.error_chunks)


def _stored(request: Request) -> tuple[str, ResponseStore]:
    return request.path_params["response_id"], request.app.state.responses


async def retrieve_response(request: Request) -> Response:
    """GET: the stored response object, as POST returned it."""
    response_id, store = _stored(request)
    entry = store.get(response_id)
    if entry is None:
        return openai_error_response(ResponseNotFoundError(response_id), request_id_of(request.scope))
    return JSONResponse(entry.response)


async def list_input_items(request: Request) -> Response:
    """GET .../input_items: the stored conversation up to this response's own output, one page of it."""
    response_id, store = _stored(request)
    try:
        entry = store.get(response_id)
        if entry is None:
            raise ResponseNotFoundError(response_id)
        inputs = entry.items[: len(entry.items) - len(entry.response["output"])]
        return JSONResponse(input_item_list(inputs, request.query_params))
    except Exception as exc:
        return openai_error_response(exc, request_id_of(request.scope))


async def delete_response(request: Request) -> Response:
    response_id, store = _stored(request)
    if not store.delete(response_id):
        return openai_error_response(ResponseNotFoundError(response_id), request_id_of(request.scope))
    return JSONResponse(ResponseDeleted(id=response_id).model_dump())


def responses_routes() -> list[BaseRoute]:
    return [
        Route("/v1/responses", create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
    ]


__all__ = ["responses_routes"]
