"""Timing a call between two events: CUDA events (device time) for the GPU benchmarks, the host clock elsewhere."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch


class Event(Protocol):
    def record(self) -> None: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end: Any) -> float: ...


class HostEvent:
    """torch.cuda.Event's timing interface on the host clock (perf_counter): for CPU runs of the same loop."""

    def __init__(self) -> None:
        self.at = 0.0

    def record(self) -> None:
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.at - self.at) * 1e3


def cuda_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)


def ms_per_call(fn: Callable[[], Any], calls: int = 1, rounds: int = 1, warmup: int = 0,
                event: Callable[[], Event] = cuda_event) -> float:
    """Milliseconds per call of `fn`: the median over `rounds` rounds of `calls` calls back to back between two events
    (the host waits for each round's end event), after `warmup` calls neither timed nor waited for. With CUDA events
    (the default) this is device time of the work the calls queue on the current stream."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rounds):
        start, end = event(), event()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)
