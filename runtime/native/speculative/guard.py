"""SpeculationGuard: speculates only where the step times measured on this engine show it faster than plain steps.

Speculation pays when the drafts it gets accepted outweigh what it adds to a step: the draft model's forwards, the
verification's wider rows, and the wait for the tokens on the host (a step that may speculate cannot run one ahead).
That balance depends on the hardware as much as on the proposer: on a compute-bound CPU a verification costs nearly
K+1 plain steps and speculation lost at one stream (0.49-0.82x), where a memory-bound GPU gained (benchmarks/RESULTS.md).
So under the configured limit the guard measures, for each number of decoding sequences d, the tokens per second of
steps that may speculate and of plain steps, and keeps the faster kind:
- a few plain steps first, then speculation, cut short after SHORT_BURST steps where it is already more than FAR
  behind (a CPU EAGLE head at 0.3x spent 16 speculating steps there, 5% of a 700-token run at one stream: 2-core box,
  2026-11-29); at a number of sequences not measured yet, once another is, what the nearest measured one chose, with
  the other kind measured in the bursts below: counts that come up rarely (one sequence between a request's end and
  the next one's prompt) otherwise speculated for every one of their steps until enough were recorded, and a draft
  that lost 2.4x there cost 5% of a whole run at two streams (H200, 2026-11-27);
- speculation is kept only while it beats plain steps by MARGIN: where the two are even, switching back and forth
  costs more than either (a switch drains the one-ahead pipeline, and a draft model catches up on the tokens of the
  plain steps: H200, 2026-11-27, draft at c=2 measured 0.98x always speculating, 0.94x switching on 2% differences);
- while speculating wins, a few plain steps every RECHECK_STEPS to see whether that still holds;
- while plain steps win, a burst of speculating steps after RETRY_STEPS, a wait that doubles each time speculation
  loses again (up to RETRY_MAX_STEPS) and starts over once it wins: acceptance drifts with the traffic, and a
  request's first tokens often accept fewer drafts than its later ones. Where speculation lost by more than FAR the
  burst is SHORT_BURST steps, measured on their own, and the wait is at least long enough that the burst costs
  BURST_SHARE of it.

Rates are ratios of decayed sums (tokens over seconds, each sample weighing 1/WINDOW less per later sample of its
kind), not averages of per-step rates: a speculating step emits 1 to k+1 tokens per sequence, and an average of those
steps' rates swung with a burst's few accepted drafts (at the end of an n-gram run at one stream it read 0.96x of
plain, where the whole run was 1.36x faster). A step's time is the interval from its start to the next step's
start. It is recorded only when both steps decode the same number of sequences and nothing else (no prompt, no idle
wait between them). The first plain step after speculation is not recorded (it launches ahead of a drained pipeline,
so it looks faster than it is); the first speculating step after plain ones is, so speculation is charged with what
a switch to it costs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# recorded (plain, speculating) steps before a kind's rate is trusted (speculation far behind: SHORT_BURST steps)
MIN_SAMPLES = (8, 16)
BURST_STEPS = (9, 16)  # steps of a re-measurement of (plain, speculating) steps: enough to measure the kind
# unaided (the first plain step after speculation is not recorded)
MARGIN = 0.03  # speculation must beat plain steps by this share
# a retry of speculation that lost by more than this share measures SHORT_BURST steps, against a fresh sum: far from
# even, a few steps tell whether acceptance changed, and each one costs (a CPU draft at 0.58x: 16-step retries cost 4%
# of a run, dev box 2026-11-27)
FAR = 0.2
SHORT_BURST = 4
RECHECK_STEPS = 256  # steps of speculation between looks at plain steps
RETRY_STEPS = 64  # steps of plain decoding before speculation is tried again; doubled after each loss
RETRY_MAX_STEPS = 2048
# where speculation is far behind, the wait before a retry is also long enough that its SHORT_BURST steps cost at most
# this share of the time between retries: an EAGLE head drafting op by op on the H200 ran at ~0.2x of plain steps,
# and its 4-step bursts every 64-256 steps cost 0.72x overall at one stream (RESULTS.md, 2026-11-29 14:42)
BURST_SHARE = 0.05
WINDOW = 32  # samples of a kind in its decayed sums (the weight of a sample falls by 1/WINDOW per later one)


@dataclass
class _Rates:
    """Measurements at one number of decoding sequences; index 0: plain steps, 1: steps that may speculate."""

    tokens: list[float] = field(default_factory=lambda: [0.0, 0.0])  # decayed sums
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0])
    samples: list[int] = field(default_factory=lambda: [0, 0])
    burst: int = 0  # steps left of a re-measurement
    burst_kind: bool = False
    since: int = 0  # steps of the chosen kind since the last re-measurement
    retry: int = RETRY_STEPS
    prior: bool | None = None  # the kind to run until both are measured (None: speculation, then plain steps)

    def record(self, kind: bool, tokens: int, seconds: float) -> None:
        i = int(kind)
        keep = 1 - 1 / WINDOW
        self.tokens[i] = keep * self.tokens[i] + tokens
        self.seconds[i] = keep * self.seconds[i] + seconds
        self.samples[i] += 1

    @property
    def measured(self) -> bool:
        plain, speculating = self.samples
        return plain >= MIN_SAMPLES[0] and (speculating >= MIN_SAMPLES[1]
                                            or speculating >= SHORT_BURST and self.far_behind())

    def far_behind(self) -> bool:
        return self.rate(True) < (1 - FAR) * self.rate(False)

    def rate(self, kind: bool) -> float:
        return self.tokens[kind] / self.seconds[kind] if self.seconds[kind] > 0 else 0.0

    def speculation_wins(self) -> bool:
        return self.rate(True) > (1 + MARGIN) * self.rate(False)

    def plain_wait(self) -> int:
        """Plain steps before speculation is measured again: `retry`, or, where it measured far behind, enough that
        a burst (SHORT_BURST steps at r times the plain rate: SHORT_BURST x (1/r - 1) plain steps' time lost) costs
        at most BURST_SHARE of the wait (at most RETRY_MAX_STEPS)."""
        if not (self.measured and self.far_behind()):
            return self.retry
        lost = SHORT_BURST * (self.rate(False) / max(self.rate(True), 1e-9) - 1)
        return max(self.retry, min(RETRY_MAX_STEPS, math.ceil(lost / BURST_SHARE)))

    def choose(self) -> bool:
        if self.burst > 0:
            self.burst -= 1
            return self.burst_kind
        if self.measured:
            speculate = self.speculation_wins()
        elif self.prior is None:  # plain steps first, then speculation until measured
            return self.samples[0] >= MIN_SAMPLES[0]
        else:
            speculate = self.prior
        if speculate:
            self.retry = RETRY_STEPS
        self.since += 1
        if self.since < (RECHECK_STEPS if speculate else self.plain_wait()):
            return speculate
        burst = BURST_STEPS[not speculate]
        if not speculate:
            self.retry = min(2 * self.retry, RETRY_MAX_STEPS)
            if self.measured and self.far_behind():
                burst = SHORT_BURST
                self.tokens[1] = self.seconds[1] = 0.0  # what the burst measures alone decides
        self.since, self.burst, self.burst_kind = 0, burst - 1, not speculate
        return not speculate


@dataclass
class _Step:
    decoding: int
    steady: bool  # every entry decodes, and one of them may draft
    speculates: bool
    recorded: bool  # its time counts (not the first plain step after speculation)
    started: float
    accepted: int = 0


class SpeculationGuard:
    """Chooses, step by step, whether a step under the limit may speculate (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._rates: dict[int, _Rates] = {}
        self._step: _Step | None = None  # the step under way

    def begin_step(self, decoding: int, steady: bool, eligible: bool = True) -> bool:
        """A step that decodes `decoding` sequences starts (`steady`: it runs nothing else; `eligible`: the limit
        allows speculation and one of them may draft): record the previous step's time, and return whether this one
        may speculate."""
        now = self.clock()
        last, steady = self._step, steady and eligible
        if (last is not None and last.steady and steady and last.decoding == decoding and last.recorded
                and now > last.started):
            self._rates[decoding].record(last.speculates, decoding + last.accepted, now - last.started)
        rates = self._rates.get(decoding)
        if rates is None:
            rates = self._rates[decoding] = _Rates(prior=self._nearest_choice(decoding))
        kind = rates.choose() if eligible else False
        self._step = _Step(decoding, steady, kind, kind or (last is not None and not last.speculates), now)
        return kind

    def _nearest_choice(self, decoding: int) -> bool | None:
        """What measurements at the nearest number of decoding sequences chose (None: none measured yet)."""
        measured = [(abs(d - decoding), d) for d, r in self._rates.items() if r.measured]
        if not measured:
            return None
        return self._rates[min(measured)[1]].speculation_wins()

    def accepted(self, count: int) -> None:
        """Drafts accepted in the step under way (tokens it emits beyond one per decoding sequence)."""
        if self._step is not None:
            self._step.accepted += count

    def tokens_per_s(self, decoding: int) -> tuple[float, float] | None:
        """(plain, speculating) averages at `decoding` sequences, once both are measured."""
        rates = self._rates.get(decoding)
        if rates is None or not rates.measured:
            return None
        return rates.rate(False), rates.rate(True)
