"""gateway/triton_stops.py: a stop reaches its caller's request of that id only (key, gRPC stream), never one
without an id, and also when it comes before the request registered."""

from __future__ import annotations

import contextlib

from gateway.triton_stops import MAX_WAITING_STOPS, STOP_WAIT, Caller, StopSignals


class Stream:
    """Stands in for a GenerationStream: counts its stops."""

    def __init__(self) -> None:
        self.stops = 0

    def stop(self) -> None:
        self.stops += 1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


ALICE, BOB = Caller(b"alice"), Caller(b"bob")


HELD = contextlib.ExitStack()  # registrations the tests leave open


def running(signals: StopSignals, caller: Caller, client_id: str) -> tuple[contextlib.ExitStack, Stream]:
    """A stream registered under `client_id` until the returned stack closes."""
    stream = Stream()
    stack = HELD.enter_context(contextlib.ExitStack())
    stack.enter_context(signals.running(caller, "ensemble", client_id, stream))  # type: ignore[arg-type]
    return stack, stream


def test_a_stop_reaches_only_its_callers_request_of_that_id() -> None:
    signals = StopSignals()
    _, alices = running(signals, ALICE, "7")
    _, bobs = running(signals, BOB, "7")
    stream_a, stream_b = Caller(b"alice", object()), Caller(b"alice", object())
    _, on_a = running(signals, stream_a, "7")
    assert signals.stop(BOB, "ensemble", "7") == 1 and (alices.stops, bobs.stops, on_a.stops) == (0, 1, 0)
    assert signals.stop(stream_b, "ensemble", "7") == 0 and on_a.stops == 0  # another stream of the same key
    assert signals.stop(stream_a, "ensemble", "7") == 1 and on_a.stops == 1
    assert signals.stop(ALICE, "tensorrt_llm", "7") == 0 and alices.stops == 0  # another model


def test_requests_and_stops_without_an_id_are_ignored() -> None:
    """tritonclient sends the empty id by default: such a stop ended every id-less request on the model."""
    signals = StopSignals()
    _, anonymous = running(signals, ALICE, "")
    assert signals.stop(ALICE, "ensemble", "") == 0 and anonymous.stops == 0
    _, later = running(signals, ALICE, "")
    assert later.stops == 0


def test_a_stop_before_its_request_registered_stops_it_as_it_registers() -> None:
    clock = Clock()
    signals = StopSignals(clock)
    assert signals.stop(ALICE, "ensemble", "9") == 0
    _, other = running(signals, BOB, "9")
    assert other.stops == 0  # not another caller's
    context, first = running(signals, ALICE, "9")
    assert first.stops == 1
    context.close()
    _, second = running(signals, ALICE, "9")
    assert second.stops == 0  # the stop was used up
    signals.stop(ALICE, "ensemble", "10")
    clock.now += STOP_WAIT + 0.1
    _, late = running(signals, ALICE, "10")
    assert late.stops == 0  # it waited long enough


def test_waiting_stops_are_bounded() -> None:
    signals = StopSignals()
    for i in range(MAX_WAITING_STOPS + 10):
        signals.stop(ALICE, "ensemble", str(i))
    _, oldest = running(signals, ALICE, "0")
    _, newest = running(signals, ALICE, str(MAX_WAITING_STOPS + 9))
    assert (oldest.stops, newest.stops) == (0, 1)
