"""The ONE Server-Sent-Events writer, shared by chat, completions and Triton generate_stream.

    sse_response(items, render, render_error=..., finish=..., on_close=..., done_marker=...)

`items` is any async iterable (usually a GenerationStream); `render` turns one item into zero or
more payloads (dict -> one `data: <json>` event, str -> sent verbatim as data). When the client
disconnects, sse-starlette cancels the writer; our `finally` then calls `on_close` (which aborts the
engine requests, returning their KV blocks). A failure mid-stream becomes one error event in the
dialect's shape (`render_error`), then the stream ends (with `done_marker` if the dialect has one).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from typing import Any, TypeVar

from sse_starlette import EventSourceResponse, ServerSentEvent

T = TypeVar("T")
Payload = dict[str, Any] | str
log = logging.getLogger("gateway.streaming")


def _event(payload: Payload) -> ServerSentEvent:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False,
                                                              separators=(",", ":"))
    return ServerSentEvent(data=data, sep="\n")


async def _events(
    items: AsyncIterable[T],
    render: Callable[[T], Iterable[Payload]],
    render_error: Callable[[BaseException], Payload],
    finish: Callable[[], Iterable[Payload]] | None,
    on_close: Callable[[], None] | None,
    done_marker: str | None,
) -> AsyncIterator[ServerSentEvent]:
    try:
        try:
            async for item in items:
                for payload in render(item):
                    yield _event(payload)
            if finish is not None:
                for payload in finish():
                    yield _event(payload)
        except Exception as exc:  # the status line is gone: report in-band, then end the stream
            yield _event(render_error(exc))
        if done_marker is not None:
            yield _event(done_marker)
    finally:
        # Runs on normal end, on error, and when sse-starlette cancels us after a disconnect.
        # Must stay synchronous: awaiting inside a cancelled anyio scope would raise again.
        if on_close is not None:
            on_close()


def sse_response(
    items: AsyncIterable[T],
    render: Callable[[T], Iterable[Payload]],
    *,
    render_error: Callable[[BaseException], Payload],
    finish: Callable[[], Iterable[Payload]] | None = None,
    on_close: Callable[[], None] | None = None,
    done_marker: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> EventSourceResponse:
    """Stream `items` as SSE: `render` per item, then `finish()`, then `done_marker` (e.g. "[DONE]").

    `render_error(exc)` gives the error event's payload; `on_close()` (sync) runs exactly once when
    the stream ends for any reason, including a client disconnect.
    """
    return EventSourceResponse(
        _events(items, render, render_error, finish, on_close, done_marker),
        headers=headers,
        sep="\n",
    )
