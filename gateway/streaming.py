"""The ONE Server-Sent-Events writer, shared by chat, completions and Triton generate_stream.

    sse_response(items, render, render_error=..., finish=..., on_close=..., done_marker=...)

`items` is any async iterable; a GenerationStream is read by `batches()`, and every event of one
batch (all the deltas that were ready together) goes out in ONE send: the per-send path through
sse-starlette, the middleware and uvicorn is the largest per-event cost, so events are coalesced
before it, never after. `render` turns one item into zero or more payloads (dict -> one
`data: <json>` event, str -> sent verbatim as data). sse-starlette's EventSourceResponse writes the
stream: we keep it for its keep-alive pings, its disconnect watcher and its shutdown handling, and
hand it pre-encoded bytes. When the client disconnects, sse-starlette cancels the writer; our
`finally` then calls `on_close` (which aborts the engine requests, returning their KV blocks). A
failure mid-stream becomes the dialect's error event(s) (`render_error`), then the stream ends (with
`done_marker` if the dialect has one). Without a send timeout (ours never sets one) a send skips the anyio
cancel scope that sse-starlette opens around each one (`EventStream`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from typing import Any, TypeVar

import orjson
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Message, Send

T = TypeVar("T")
Payload = dict[str, Any] | str
_SEP = "\n"
# orjson is ~10x faster than json.dumps per chunk and writes the same compact JSON; the stdlib
# encoder remains for what orjson refuses (lone surrogates, integers over 64 bits), ASCII-escaped
# so that a lone surrogate becomes a \uXXXX escape instead of failing to encode.
_fallback_encode = json.JSONEncoder(separators=(",", ":")).encode


def json_bytes(payload: Any) -> bytes:
    """Compact JSON (no spaces, UTF-8 unescaped), as bytes."""
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        return _fallback_encode(payload).encode()


def encode_event(payload: Payload) -> bytes:
    """One SSE event: `data: <json>` for a dict, the text as data (line by line) for a str."""
    if isinstance(payload, str):
        return ServerSentEvent(data=payload, sep=_SEP).encode()
    return b"data: " + json_bytes(payload) + b"\n\n"


async def _batches(items: AsyncIterable[T]) -> AsyncIterator[list[T]]:
    batches = getattr(items, "batches", None)
    if batches is not None:  # a GenerationStream: deltas that were ready together
        async for batch in batches():
            yield batch
    else:
        async for item in items:
            yield [item]


async def _frames(
    items: AsyncIterable[T],
    render: Callable[[T], Iterable[Payload]],
    render_error: Callable[[BaseException], Payload | list[Payload]],
    finish: Callable[[], Iterable[Payload]] | None,
    on_close: Callable[[], None] | None,
    done_marker: str | None,
) -> AsyncIterator[bytes]:
    """The response body: one bytes chunk (one send) per batch of items."""
    try:
        tail: list[bytes] = []
        try:
            async for batch in _batches(items):
                frames = [encode_event(payload) for item in batch for payload in render(item)]
                if frames:
                    yield b"".join(frames)
            if finish is not None:
                tail = [encode_event(payload) for payload in finish()]
        except Exception as exc:  # the status line is gone: report in-band, then end the stream
            errors = render_error(exc)
            tail = [encode_event(payload) for payload in (errors if isinstance(errors, list) else [errors])]
        if done_marker is not None:
            tail.append(encode_event(done_marker))
        if tail:
            yield b"".join(tail)
    finally:
        # Runs on normal end, on error, and when sse-starlette cancels us after a disconnect.
        # Must stay synchronous: awaiting inside a cancelled anyio scope would raise again.
        if on_close is not None:
            on_close()


class EventStream(EventSourceResponse):
    """sse-starlette's response, minus a cancel scope per send when there is no send timeout: entering and
    leaving anyio's scope was about 5% of the front end's CPU per streamed token (benchmarks/RESULTS.md)."""

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)


def sse_response(
    items: AsyncIterable[T],
    render: Callable[[T], Iterable[Payload]],
    *,
    render_error: Callable[[BaseException], Payload | list[Payload]],
    finish: Callable[[], Iterable[Payload]] | None = None,
    on_close: Callable[[], None] | None = None,
    done_marker: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> EventStream:
    """Stream `items` as SSE: `render` per item, then `finish()`, then `done_marker` (e.g. "[DONE]").

    `render_error(exc)` gives the error event's payload (or several); `on_close()` (sync) runs exactly once when
    the stream ends for any reason, including a client disconnect.
    """
    return EventStream(
        _frames(items, render, render_error, finish, on_close, done_marker),
        headers=headers,
        sep=_SEP,
    )
