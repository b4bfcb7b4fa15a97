"""Hand-off of deltas from the engine's step thread to the event loops that wait for them.

Each step the engine queues its deltas here; `flush` then makes ONE `loop.call_soon_threadsafe` per event
loop, which puts them into the per-request asyncio queues read by `NativeEngine.generate_batches`.
Deltas of non-streamed requests are held until the request ends: one hand-off in all instead of one per step.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from runtime.request import OutputDelta
from runtime.request_state import RequestState

END = object()  # queued after a request's last delta


class Outbox:
    """Deltas produced by the step thread, waiting for the next `flush`. Used by the step thread only."""

    def __init__(self) -> None:
        self._items: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Any], Any]]] = {}
        self._held: dict[str, list[OutputDelta]] = {}  # deltas of non-streamed requests, until they end

    def emit(self, state: RequestState, deltas: list[OutputDelta], final: bool = False) -> None:
        """Queue `deltas` of `state` (stamped with the time they were produced); `final`: its last ones."""
        state.decorate(deltas)
        now = time.monotonic()
        for d in deltas:
            d.time = now
        if state.loop is None:
            return
        if not state.request.stream:
            held = self._held.setdefault(state.request_id, [])
            held.extend(deltas)
            if not final:
                return
            deltas = self._held.pop(state.request_id)
        items = self._items.setdefault(state.loop, [])  # type: ignore[arg-type]
        items.extend((state.queue, d) for d in deltas)  # type: ignore[misc]
        if final:
            items.append((state.queue, END))  # type: ignore[arg-type]

    def flush(self) -> None:
        """Hand everything queued so far to its event loop."""
        items, self._items = self._items, {}
        for loop, batch in items.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # the caller's event loop is closed: nobody is listening
                pass


def _deliver(items: list[tuple[asyncio.Queue[Any], Any]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)
