"""benchmarks/cuda_timing.ms_per_call on a fake clock: which calls it times, per call, and the median of rounds."""

from __future__ import annotations

import time

from benchmarks.cuda_timing import HostEvent, ms_per_call


class Clock:
    """A fake device: each call of `work` costs the next of `costs` ms; events read the time so far."""

    def __init__(self, costs: list[float]) -> None:
        self.costs, self.now, self.calls, self.waits = iter(costs), 0.0, 0, 0

    def work(self) -> None:
        self.now += next(self.costs)
        self.calls += 1

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, clock: Clock) -> None:
        self.clock, self.at = clock, None

    def record(self) -> None:
        self.at = self.clock.now

    def synchronize(self) -> None:
        self.clock.waits += 1

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.at - self.at


def test_warmup_calls_are_not_timed_and_one_round_is_per_call() -> None:
    clock = Clock([100.0, 100.0, 1.0, 2.0, 3.0])
    assert ms_per_call(clock.work, calls=3, warmup=2, event=clock.event) == 2.0
    assert (clock.calls, clock.waits) == (5, 1)


def test_median_over_rounds_of_per_call_times() -> None:
    # rounds of 2 calls: 5, 50, 1, 3, 4 ms per call; median 4
    costs = [5, 5, 50, 50, 1, 1, 3, 3, 4, 4]
    clock = Clock([float(c) for c in costs])
    assert ms_per_call(clock.work, calls=2, rounds=5, event=clock.event) == 4.0
    assert (clock.calls, clock.waits) == (10, 5)


def test_even_rounds_take_the_mean_of_the_middle_two() -> None:
    clock = Clock([1.0, 2.0, 4.0, 8.0])
    assert ms_per_call(clock.work, rounds=4, event=clock.event) == 3.0


def test_host_event_times_in_milliseconds() -> None:
    ms = ms_per_call(lambda: time.sleep(0.02), calls=2, event=HostEvent)
    assert ms >= 20.0  # sleep waits at least this long; an upper bound would depend on the machine's load
