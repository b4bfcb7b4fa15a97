"""The ONE Server-Sent-Events writer, shared by chat, completions and Triton generate_stream.

    sse_response(items, render, watch=..., render_error=..., finish=..., on_close=..., done_marker=...)

`items` is any async iterable; a GenerationStream is read by `batches()`, and every event of one
batch (all the deltas that were ready together) goes out in ONE send: the per-send path through
the middleware and uvicorn is the largest per-event cost, so events are coalesced before it, never
after. `render` turns one item into zero or more payloads (dict -> one `data: <json>` event, str ->
sent verbatim as data, encoded by sse-starlette's ServerSentEvent). `EventStream` writes the bytes,
with keep-alive pings. When the client disconnects, the request's DisconnectWatch cancels the writer;
our `finally` then calls `on_close` (which aborts the engine requests, returning their KV blocks). A
failure mid-stream becomes the dialect's error event(s) (`render_error`), then the stream ends (with
`done_marker` if the dialect has one).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Mapping,
)
from datetime import datetime, timezone
from typing import Any, TypeVar

import orjson
from sse_starlette import ServerSentEvent
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.disconnect import DisconnectWatch

T = TypeVar("T")
Payload = dict[str, Any] | str
_SEP = "\n"
# As sse-starlette sets them: no caching, and no buffering in nginx (X-Accel-Buffering), which would hold events.
_SSE_HEADERS = {"Cache-Control": "no-store", "Connection": "keep-alive", "X-Accel-Buffering": "no"}
PING_INTERVAL_S = 15.0  # a comment line keeps idle proxies from closing a quiet stream (sse-starlette's default)
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
) -> AsyncGenerator[tuple[bytes, bool], None]:
    """The response body: one bytes chunk (one send) per batch of items, then the finish events and end marker
    as the last chunk (True: it also ends the response, in the same send)."""
    try:
        tail: list[bytes] = []
        try:
            async for batch in _batches(items):
                frames = [encode_event(payload) for item in batch for payload in render(item)]
                if frames:
                    yield b"".join(frames), False
            if finish is not None:
                tail = [encode_event(payload) for payload in finish()]
        except Exception as exc:  # the status line is gone: report in-band, then end the stream
            errors = render_error(exc)
            tail = [encode_event(payload) for payload in (errors if isinstance(errors, list) else [errors])]
        if done_marker is not None:
            tail.append(encode_event(done_marker))
        yield b"".join(tail), True
    finally:
        # Runs on normal end, on error, and when EventStream is cancelled after a disconnect.
        # Must stay synchronous: it also runs while the stream is being cancelled (EventStream closes us then).
        if on_close is not None:
            on_close()


class EventStream(Response):
    """A text/event-stream response writing pre-encoded events (`chunks`: bytes, and whether they are the last),
    with a keep-alive comment every `PING_INTERVAL_S`, ended quietly when `watch` sees the client leave (the
    body's cleanup then runs).

    It does what sse-starlette's EventSourceResponse did for us with one task per request instead of four in an
    anyio task group (writer, disconnect listener, pinger, shutdown listener), whose locks, events and cancel
    scopes were about 30% of the front end's loop per short request (py-spy; with DisconnectWatch, 0.68 -> 0.54 ms
    of loop CPU per 1-token request, benchmarks/RESULTS.md 2026-11-27). The writer is the request's own task;
    the watch is its only other. A server shutdown needs no listener: gateway.shutdown drains streams first."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncGenerator[tuple[bytes, bool], None], watch: DisconnectWatch,
                 headers: Mapping[str, str] | None = None) -> None:
        self.body_iterator = chunks
        self.watch = watch
        self.status_code = 200
        self.background = None
        self.init_headers({**_SSE_HEADERS, **(headers or {})})
        self._open = True  # until the closing message is sent: a ping after it would be a protocol error
        self._send_lock = asyncio.Lock()  # the closing message and pings
        self._pinger: asyncio.TimerHandle | asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._schedule_ping(send)
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk, last in self.body_iterator:
                if not last:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    continue
                async with self._send_lock:
                    self._open = False
                    await send({"type": "http.response.body", "body": chunk, "more_body": False})
        except asyncio.CancelledError:
            if not self.watch.caused_cancel():
                raise
        finally:
            self._open = False
            self.watch.close()
            if self._pinger is not None:
                self._pinger.cancel()
            # a send that failed or was cancelled left the body suspended at a `yield`: run its cleanup now
            await self.body_iterator.aclose()

    def _schedule_ping(self, send: Send) -> None:
        self._pinger = asyncio.get_running_loop().call_later(PING_INTERVAL_S, self._start_ping, send)

    def _start_ping(self, send: Send) -> None:
        self._pinger = asyncio.get_running_loop().create_task(self._ping(send))

    async def _ping(self, send: Send) -> None:
        async with self._send_lock:
            if not self._open:
                return
            comment = ServerSentEvent(comment=f"ping - {datetime.now(timezone.utc)}", sep=_SEP).encode()
            await send({"type": "http.response.body", "body": comment, "more_body": True})
        self._schedule_ping(send)


def sse_response(
    items: AsyncIterable[T],
    render: Callable[[T], Iterable[Payload]],
    *,
    watch: DisconnectWatch,
    render_error: Callable[[BaseException], Payload | list[Payload]],
    finish: Callable[[], Iterable[Payload]] | None = None,
    on_close: Callable[[], None] | None = None,
    done_marker: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> EventStream:
    """Stream `items` as SSE: `render` per item, then `finish()`, then `done_marker` (e.g. "[DONE]").

    `watch` (created before the request's first await on the engine) is closed when the stream ends; a
    disconnect it sees ends the stream. `render_error(exc)` gives the error event's payload (or several);
    `on_close()` (sync) runs exactly once when the stream ends for any reason, including a client disconnect.
    """
    return EventStream(_frames(items, render, render_error, finish, on_close, done_marker), watch, headers)
