"""Outbox: hand-off of the engine core's step outputs from its thread to whoever waits for them.

After each step the core's driver hands the StepOutput (runtime/native/step_output.py) to an Outbox, which passes it on
in one go:
- `Outbox` (in-process): ONE `loop.call_soon_threadsafe` per event loop, which puts the deltas into the
  per-request asyncio queues read by `read_batches` (runtime/delivery.py);
- `runtime.native.core_process.SocketOutbox`: one message to the front-end process.
Deltas of non-streamed requests are held until the request ends: one hand-off in all instead of one per step.
With `stream_interval` N > 1 (--stream-interval, as vLLM's and TensorRT-LLM's option of that name) a streamed
request's first delta goes out at once, then its deltas wait until one sequence has N tokens waiting, or it ends:
every part of the path to the client (message, hand-off, SSE event, socket write) then runs once per N tokens.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from runtime.delivery import END
from runtime.request import OutputDelta, coalesce
from runtime.native.request_state import RequestState
from runtime.native.step_output import StepOutput

Pending = list[tuple[RequestState, list[OutputDelta], bool]]  # (request, its deltas, are they its last)


class Outbox:
    """Step outputs waiting for the next `flush`. Used by the core's thread only."""

    def __init__(self, stream_interval: int = 1) -> None:
        self.stream_interval = stream_interval  # EngineConfig has checked that it is at least 1
        self._pending: Pending = []
        # Deltas held back, by request id: a non-streamed request's until it ends; with a stream interval, a
        # streamed request's since its last hand-off (an empty list once its first delta went out).
        self._held: dict[str, list[OutputDelta]] = {}

    def put(self, out: StepOutput) -> None:
        """Queue a step's outputs (its plain tokens before its deltas: StepOutput's order) and hand them over."""
        for state, token_id in zip(out.token_states, out.token_ids):
            self.add_token(state, token_id)
        for state, deltas, final in out.deltas:
            self.emit(state, deltas, final)
        self.flush()

    def emit(self, state: RequestState, deltas: list[OutputDelta], final: bool = False) -> None:
        """Queue `deltas` of `state` (stamped with the time they were produced); `final`: its last ones."""
        now = time.monotonic()
        for d in deltas:
            d.time = now
        request, request_id = state.request, state.request_id
        if request.stream and self.stream_interval == 1:
            pass  # every step's deltas go out
        elif request.stream and request_id not in self._held:  # a stream's first delta goes out at once (TTFT)
            if not final:
                self._held[request_id] = []
        else:
            held = self._held.setdefault(request_id, [])
            held.extend(deltas)
            if not final and (not request.stream or _most_tokens(held) < self.stream_interval):
                return
            del self._held[request_id]
            if not final:
                self._held[request_id] = []
            deltas = coalesce(held) if request.stream else held
        self._pending.append((state, deltas, final))

    def add_token(self, state: RequestState, token_id: int) -> None:
        """A plain token (StepOutput's columns). In-process it becomes a delta; the engine core's outbox sends it as
        an id (runtime/native/core_process.py)."""
        self.emit(state, [OutputDelta(state.request_id, 0, [token_id])])

    def flush(self) -> None:
        """Hand everything queued so far over."""
        pending, self._pending = self._pending, []
        self.send(pending)

    def send(self, pending: Pending) -> None:
        """In-process: into each request's asyncio queue, one call per event loop."""
        items: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Any], Any]]] = {}
        for state, deltas, final in pending:
            if state.loop is None or state.queue is None:  # driven without a consumer (unit tests)
                continue
            batch = items.setdefault(state.loop, [])
            batch.extend((state.queue, d) for d in deltas)
            if final:
                batch.append((state.queue, END))
        for loop, batch in items.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # the caller's event loop is closed: nobody is listening
                pass


def _most_tokens(deltas: list[OutputDelta]) -> int:
    """The most tokens that any one sequence has in `deltas`."""
    tokens: dict[int, int] = {}
    for d in deltas:
        tokens[d.index] = tokens.get(d.index, 0) + len(d.token_ids)
    return max(tokens.values(), default=0)


def _deliver(items: list[tuple[asyncio.Queue[Any], Any]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)
