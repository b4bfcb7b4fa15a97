"""Triton stop signals: a request whose `stop` input is true ends the caller's running request with the same id
(the backend's `inflight_batcher_llm_client.py --stop-after-ms`).

    stops = stop_signals(app.state)
    with stops.running(caller, model, client_id, stream):    # from before the request is submitted
        ...
    stops.stop(caller, model, client_id)                     # a stop signal's whole effect

A stop reaches only its caller's requests: a `Caller` is the API key (every caller without a configured key
shares the anonymous one) and, on gRPC, the ModelStreamInfer stream, so no client can stop another's request
by guessing its id. A stop for the empty id (tritonclient's default) is ignored, and requests without an id
cannot be stopped. A stop that finds no such request yet is kept for STOP_WAIT seconds: the request it names
may still be parsing (on a stream the two run concurrently), and is stopped as it registers, before any token.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import State

from gateway.generation import GenerationStream

STOP_WAIT = 10.0  # s a stop waits for the request it names to register
MAX_WAITING_STOPS = 4096  # stops waiting at once, the oldest dropped first


@dataclass(frozen=True)
class Caller:
    """Whose requests a stop may reach: the API key's identity (b"": anonymous) and, on gRPC, the stream."""

    key: bytes
    stream: Any = None  # an object unique to one ModelStreamInfer call; None: HTTP and unary gRPC


Name = tuple[Caller, str, str]  # (caller, model, client request id)


class StopSignals:
    """The running requests that a stop may end, and the stops that came before their request."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._running: dict[Name, list[GenerationStream]] = {}
        self._waiting: OrderedDict[Name, float] = OrderedDict()  # name -> when the stop stops waiting
        self._clock = clock

    @contextlib.contextmanager
    def running(self, caller: Caller, model: str, client_id: str, stream: GenerationStream) -> Iterator[None]:
        """Make `stream` stoppable while the body runs (before it is started: a stop may come at any time)."""
        if not client_id:
            yield
            return
        name = (caller, model, client_id)
        self._expire()
        if self._waiting.pop(name, None) is not None:
            stream.stop()
        self._running.setdefault(name, []).append(stream)
        try:
            yield
        finally:
            streams = self._running[name]
            streams.remove(stream)
            if not streams:
                del self._running[name]

    def stop(self, caller: Caller, model: str, client_id: str) -> int:
        """End the caller's requests running under `client_id` (each with the tokens it has); how many. With none
        running, the stop waits for one to register."""
        if not client_id:
            return 0
        name = (caller, model, client_id)
        streams = self._running.get(name, [])
        for stream in streams:
            stream.stop()
        if not streams:
            self._expire()
            self._waiting.pop(name, None)  # (re)inserted last: expiries stay in order
            self._waiting[name] = self._clock() + STOP_WAIT
            while len(self._waiting) > MAX_WAITING_STOPS:
                self._waiting.popitem(last=False)
        return len(streams)

    def _expire(self) -> None:
        now = self._clock()
        while self._waiting and next(iter(self._waiting.values())) <= now:
            self._waiting.popitem(last=False)


def stop_signals(state: State) -> StopSignals:
    """The app's stop signals (made on first use)."""
    signals = getattr(state, "triton_stops", None)
    if signals is None:
        signals = state.triton_stops = StopSignals()
    return signals
