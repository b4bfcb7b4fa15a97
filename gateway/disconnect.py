"""Run a coroutine for a non-streamed response, cancelling it if the client disconnects first.

The request body has already been read, so the next ASGI `receive()` only returns once the client
goes away (`http.disconnect`); racing it against the work costs no polling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from gateway.errors import ClientDisconnected

T = TypeVar("T")


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise ClientDisconnected.

    Cancelling `work` must release its resources (GenerationStream closes in a `finally`).
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.done() and not task.cancelled():
        return task.result()
    raise ClientDisconnected()
