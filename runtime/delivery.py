"""Where a request's deltas wait for its reader: `Mailbox` (a cheaper single-reader stand-in for asyncio.Queue) and
`read_batches`, which hands out everything queued per wake-up until END. The engine core's side of the hand-off is
runtime/native/outbox.py.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable
from typing import Any

from runtime.request import OutputDelta

END = object()  # queued after a request's last delta


class Mailbox:
    """An unbounded queue with one reader: the part of asyncio.Queue that `read_batches` uses, without its
    getter list and task counting. A front end puts one item per request per step (per-token work on the
    event loop; benchmarks/RESULTS.md, 2026-11-26 12:00-12:20)."""

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():  # the reader may have been cancelled
                waiter.set_result(None)

    async def get(self) -> Any:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._items.popleft()

    def get_nowait(self) -> Any:
        return self._items.popleft()

    def empty(self) -> bool:
        return not self._items


async def read_batches(queue: asyncio.Queue[Any] | Mailbox,
                       on_early_exit: Callable[[], None]) -> AsyncIterator[list[OutputDelta]]:
    """Every delta already queued, one list per wake-up, until END. An exception queued first is raised (a
    request the engine refused after it was handed over). `on_early_exit()` runs when the reader leaves before
    END or the refusal is raised (the caller aborts the request there): close this generator to run it at once."""
    done = False
    try:
        while True:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            if isinstance(batch[0], BaseException):
                raise batch[0]
            if batch[-1] is END:  # nothing is queued after END
                done = True
                if len(batch) > 1:
                    yield batch[:-1]
                return
            yield batch
    finally:
        if not done:
            on_early_exit()
