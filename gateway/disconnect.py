"""DisconnectWatch: the one task per request that notices its client leave.

    with DisconnectWatch(request.receive) as watch:      # closed at the end of the block...
        result = await watch.until_disconnected(work)   # ClientDisconnected if the client leaves first
        return sse_response(..., watch=watch.hand_over())  # ...unless a streamed response took it over
    (the response: a cancellation that `watch.caused_cancel()` is the end of the stream; it closes the watch)

The request body has already been read, so the next ASGI `receive()` only returns once the client goes
away (`http.disconnect`). The watcher then cancels the request's own task at whatever it awaits (the first
output, the next deltas, a send), whose cleanup aborts the engine requests and frees their KV blocks. The
work runs in the request's task, not in one of its own: a task per awaited phase and sse-starlette's four
tasks per stream (writer, disconnect listener, pinger, shutdown listener, in an anyio task group) were about
a third of the event loop's samples per short request (py-spy, benchmarks/RESULTS.md, 2026-11-27).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

from gateway.errors import ClientDisconnected

T = TypeVar("T")


class DisconnectWatch:
    """Cancels the task that created it when the client disconnects, until `close()`."""

    def __init__(self, receive: Receive) -> None:
        owner = asyncio.current_task()
        assert owner is not None, "a DisconnectWatch belongs to the task serving the request"
        self._owner = owner
        self.disconnected = False
        self._handed_over = False
        self._watcher = asyncio.get_running_loop().create_task(self._wait(receive))

    def __enter__(self) -> DisconnectWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._handed_over:
            self.close()

    def hand_over(self) -> DisconnectWatch:
        """Keep watching past the `with` block: the streamed response it goes to closes it."""
        self._handed_over = True
        return self

    async def _wait(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        self._owner.cancel()

    def caused_cancel(self) -> bool:
        """Whether the owner's cancellation came from this watch (then it is withdrawn: the owner goes on to
        end the request) rather than from elsewhere (a server shutdown: re-raise it)."""
        return self.disconnected and self._owner.uncancel() == 0

    async def until_disconnected(self, work: Awaitable[T]) -> T:
        """Await `work`; ClientDisconnected if the client leaves first (cancelling `work` must release its
        resources: GenerationStream closes in a `finally`)."""
        try:
            return await work
        except asyncio.CancelledError:
            if self.caused_cancel():
                raise ClientDisconnected() from None
            raise

    def close(self) -> None:
        """Stop watching (idempotent). Only the owner's awaits can take the watcher's cancellation, so once the
        owner runs this, none can reach it later."""
        self._watcher.cancel()


async def until_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work` under a watch of its own (a non-streamed response); ClientDisconnected if the client
    leaves first."""
    with DisconnectWatch(receive) as watch:
        return await watch.until_disconnected(work)
