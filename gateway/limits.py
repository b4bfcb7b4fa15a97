"""Request-size limits enforced before a body is trusted: --max-body-bytes (413) and
--max-json-depth (400). Field-level limits (n, stop strings, ...) live in adapters/openai/limits.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import BodyTooLargeError, render_for_path
from gateway.middleware import request_id_of
from runtime.errors import InvalidRequestError


class BodySizeLimitMiddleware:
    """413 for bodies over `max_bytes`: at once from Content-Length, else while the body streams in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = render_for_path(scope["path"], BodyTooLargeError(self.max_bytes), request_id_of(scope))
            await response(scope, receive, send)
            return
        seen = 0

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # chunked upload without Content-Length
                    raise BodyTooLargeError(self.max_bytes)
            return message

        await self.app(scope, counted_receive, send)


def json_depth(value: Any) -> int:
    """Nesting depth of decoded JSON (a scalar is 0, [] or {} is 1), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
            deepest = max(deepest, depth + 1)
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
            deepest = max(deepest, depth + 1)
    return deepest


def openai_parse_error(exc: ValueError) -> str:
    return (f"We could not parse the JSON body of your request: {exc}. The OpenAI API expects a JSON "
            "payload (Content-Type: application/json).")


def parse_json(body: bytes, max_depth: int, parse_error: Callable[[ValueError], str] = openai_parse_error) -> Any:
    """Decode a JSON body; InvalidRequestError (400) when it does not parse (worded by `parse_error`, for
    the caller's dialect) or nests deeper than `max_depth`."""
    too_deep = InvalidRequestError(f"The JSON body is nested more than {max_depth} levels deep (--max-json-depth).")
    try:
        value = json.loads(body)
    except RecursionError:  # the decoder's own stack ran out: far past any sane limit
        raise too_deep from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(parse_error(exc)) from None
    if json_depth(value) > max_depth:
        raise too_deep
    return value
