"""MeasuredPolicy: whether a step should speculate, from the step times measured on this engine.

Speculation pays when the drafts it gets accepted outweigh what it adds to a step: the draft model's forwards,
the verification's wider rows, and the wait for the tokens on the host (a step that may speculate cannot run one
ahead). That balance moves with the model, the device, the proposer's acceptance on the traffic and the number of
sequences decoding, so it is measured, not configured. For each number of decoding sequences d the policy keeps an
exponential average of the tokens per second of steps that were allowed to speculate and of steps that were not.
Where one is not known yet, steps try it (speculation first); then the faster kind runs, and every `refresh` steps
the other runs for a few steps again (acceptance drifts with the traffic).

A step's time is the interval from its start to the next step's start. It is recorded only when both steps decode
the same number of sequences and nothing else (no prompt, no idle wait between them), and the step before it was of
the same kind: a switch drains or fills the one-ahead pipeline, which would charge one kind with the other's time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

MIN_SAMPLES = 4  # recorded steps of a kind before its average is trusted
REFRESH_STEPS = 512  # steps at one d between re-measurements of the kind not chosen
BURST_STEPS = 4  # steps of a re-measurement (its first step after a switch is not recorded)
SMOOTHING = 0.2  # weight of a new sample in the averages


@dataclass
class _Rates:
    """Measurements at one number of decoding sequences; index 0: plain steps, 1: steps that may speculate."""

    tokens_per_s: list[float] = field(default_factory=lambda: [0.0, 0.0])
    samples: list[int] = field(default_factory=lambda: [0, 0])
    burst: int = 0  # steps left of a re-measurement
    burst_kind: bool = False
    since_refresh: int = 0

    def record(self, kind: bool, rate: float) -> None:
        i = int(kind)
        self.tokens_per_s[i] = rate if self.samples[i] == 0 else (1 - SMOOTHING) * self.tokens_per_s[i] + SMOOTHING * rate
        self.samples[i] += 1

    def choose(self) -> bool:
        if self.burst > 0:
            self.burst -= 1
            return self.burst_kind
        if self.samples[1] < MIN_SAMPLES:
            return True
        if self.samples[0] < MIN_SAMPLES:
            return False
        best = self.tokens_per_s[1] > self.tokens_per_s[0]
        self.since_refresh += 1
        if self.since_refresh < REFRESH_STEPS:
            return best
        self.since_refresh, self.burst, self.burst_kind = 0, BURST_STEPS - 1, not best
        return not best


@dataclass
class _Step:
    decoding: int
    steady: bool  # every entry decodes
    speculates: bool
    after_same_kind: bool
    started: float
    accepted: int = 0


class MeasuredPolicy:
    """Chooses, step by step, whether a step may speculate (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._rates: dict[int, _Rates] = {}
        self._step: _Step | None = None  # the step under way

    def begin_step(self, decoding: int, steady: bool, eligible: bool = True) -> bool:
        """A step that decodes `decoding` sequences starts (`steady`: it runs nothing else; `eligible`: one of them
        may draft): record the previous step's time, and return whether this one may speculate."""
        now = self.clock()
        last, steady = self._step, steady and eligible
        if (last is not None and last.steady and steady and last.decoding == decoding and last.after_same_kind
                and now > last.started):
            self._rates[decoding].record(last.speculates, (decoding + last.accepted) / (now - last.started))
        kind = self._rates.setdefault(decoding, _Rates()).choose() if eligible else False
        self._step = _Step(decoding, steady, kind, last is not None and last.speculates == kind, now)
        return kind

    def accepted(self, count: int) -> None:
        """Drafts accepted in the step under way (tokens it emits beyond one per decoding sequence)."""
        if self._step is not None:
            self._step.accepted += count

    def tokens_per_s(self, decoding: int) -> tuple[float, float] | None:
        """(plain, speculating) averages at `decoding` sequences, once both are measured."""
        rates = self._rates.get(decoding)
        if rates is None or min(rates.samples) < MIN_SAMPLES:
            return None
        return rates.tokens_per_s[0], rates.tokens_per_s[1]
