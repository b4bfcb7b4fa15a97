"""SpeculationGuard (runtime/native/speculative/guard.py) on a fake clock: it measures plain steps first, then
speculation (a few steps where it is far behind), keeps the faster kind at each number of decoding sequences, looks at the other kind again now and then (speculation
again after a wait that doubles while it keeps losing), keeps plain steps where speculation wins by less than its
margin, and never charges a step with time that is not its own."""

from __future__ import annotations

import pytest

from runtime.native.speculative.guard import (BURST_SHARE, BURST_STEPS, MARGIN, MIN_SAMPLES, RECHECK_STEPS, RETRY_MAX_STEPS, RETRY_STEPS,
                                        SHORT_BURST, WINDOW, SpeculationGuard)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(guard: SpeculationGuard, clock: Clock, steps: int, decoding: int, spec_cost: float, spec_accepted: int,
        plain_cost: float = 1.0) -> list[bool]:
    """`steps` steady steps at `decoding` sequences: a speculating one takes `spec_cost` seconds and gets
    `spec_accepted` drafts accepted, a plain one `plain_cost`. Returns each step's kind."""
    kinds = []
    for _ in range(steps):
        kind = guard.begin_step(decoding, steady=True)
        if kind:
            guard.accepted(spec_accepted)
        clock.now += spec_cost if kind else plain_cost
        kinds.append(kind)
    return kinds


# plain steps first (the first step follows none: not recorded), then speculation; SHORT_BURST steps where it is far
# behind
EXPLORE = [False] * (MIN_SAMPLES[0] + 1) + [True] * MIN_SAMPLES[1]
FAR_EXPLORE = [False] * (MIN_SAMPLES[0] + 1) + [True] * SHORT_BURST
PLAIN, SPEC = 0, 1


def starts(kinds: list[bool], kind: bool) -> list[int]:
    """Indices where a run of `kind` begins."""
    return [i for i, k in enumerate(kinds) if k == kind and (i == 0 or kinds[i - 1] != kind)]


def test_measures_plain_steps_then_speculation_and_keeps_the_faster_kind() -> None:
    # 8 tokens in 1.5 s, 2.2 s (behind 4 in 1 s, within FAR) or 6 s (far behind: measured in SHORT_BURST steps)
    for spec_cost, accepted, want, explore in ((1.5, 4, True, EXPLORE), (2.2, 4, False, EXPLORE),
                                               (6.0, 4, False, FAR_EXPLORE)):
        clock = Clock()
        guard = SpeculationGuard(clock)
        kinds = run(guard, clock, 60, 4, spec_cost, accepted)
        assert kinds[: len(explore)] == explore
        assert set(kinds[len(explore):]) == {want}
        plain, spec = guard.tokens_per_s(4)  # type: ignore[misc]
        assert plain == 4.0 and spec == pytest.approx(8 / spec_cost)


def test_speculation_that_wins_by_less_than_the_margin_gives_way_to_plain_steps() -> None:
    for gain, want in ((MARGIN / 2, False), (2 * MARGIN, True)):
        clock = Clock()
        guard = SpeculationGuard(clock)
        kinds = run(guard, clock, 60, 1, spec_cost=2 / (1 + gain), spec_accepted=1)  # 2 tokens vs 1 in 1 s
        assert set(kinds[len(EXPLORE):]) == {want}


def test_each_number_of_decoding_sequences_is_measured_on_its_own() -> None:
    clock = Clock()
    guard = SpeculationGuard(clock)
    run(guard, clock, 60, 2, spec_cost=1.5, spec_accepted=3)  # at 2 sequences: 5 tokens in 1.5 s vs 2 in 1 s
    # at 8 it speculates first, as at 2, then plain steps measured at the recheck win: 11 in 3 s vs 8 in 1 s
    kinds = run(guard, clock, RECHECK_STEPS + 2 * BURST_STEPS[PLAIN], 8, spec_cost=3.0, spec_accepted=3)
    assert kinds[:RECHECK_STEPS - 1] == [True] * (RECHECK_STEPS - 1) and kinds[-1] is False
    assert run(guard, clock, 3, 2, spec_cost=1.5, spec_accepted=3) == [True] * 3
    assert guard.tokens_per_s(5) is None


def test_a_new_number_of_sequences_starts_as_the_nearest_measured_one_chose() -> None:
    clock = Clock()
    guard = SpeculationGuard(clock)
    run(guard, clock, 60, 4, spec_cost=3.0, spec_accepted=4)  # at 4: plain steps win (8 tokens in 3 s vs 4 in 1 s)
    run(guard, clock, 60, 1, spec_cost=3.0, spec_accepted=1)  # at 1 as well
    # at 3 (nearest: 4): plain steps from the start, speculation measured in a burst after RETRY_STEPS
    kinds = run(guard, clock, RETRY_STEPS + BURST_STEPS[SPEC], 3, spec_cost=1.0, spec_accepted=3)
    assert kinds[: RETRY_STEPS - 1] == [False] * (RETRY_STEPS - 1)
    assert kinds[RETRY_STEPS - 1 :] == [True] * (BURST_STEPS[SPEC] + 1)
    assert run(guard, clock, 10, 3, spec_cost=1.0, spec_accepted=3) == [True] * 10  # where it wins, it stays


@pytest.mark.parametrize(("spec_cost", "burst"), [(2.1, BURST_STEPS[SPEC]), (3.0, SHORT_BURST)])
def test_while_plain_steps_win_speculation_is_retried_after_a_doubling_wait(spec_cost: float, burst: int) -> None:
    """2 tokens in 2.1 s (close to plain's 1 a second): long retries; in 3 s (far below): short ones."""
    clock = Clock()
    guard = SpeculationGuard(clock)
    explore = len(EXPLORE if burst == BURST_STEPS[SPEC] else FAR_EXPLORE)
    kinds = run(guard, clock, explore + 8 * RETRY_STEPS, 1, spec_cost=spec_cost, spec_accepted=1)[explore:]
    retries = starts(kinds, True)
    waits = [retries[0]] + [b - a - burst for a, b in zip(retries, retries[1:])]
    assert waits[:3] == [RETRY_STEPS - 1, 2 * RETRY_STEPS - 1, 4 * RETRY_STEPS - 1]
    assert all(sum(kinds[i : i + burst]) == burst and not kinds[i + burst] for i in retries)
    assert 2 * RETRY_STEPS <= RETRY_MAX_STEPS


def test_speculation_far_behind_is_retried_only_as_often_as_its_bursts_cost_a_small_share() -> None:
    """2 tokens in 10 s (a fifth of plain's rate): a 4-step burst loses 16 plain steps' time, so the first retry
    waits 16 / BURST_SHARE steps, not RETRY_STEPS, until the doubling retry wait passes that."""
    clock = Clock()
    guard = SpeculationGuard(clock)
    explore = len(FAR_EXPLORE)
    kinds = run(guard, clock, explore + 1500, 1, spec_cost=10.0, spec_accepted=1)[explore:]
    retries = starts(kinds, True)
    waits = [retries[0]] + [b - a - SHORT_BURST for a, b in zip(retries, retries[1:])]
    wait = round(SHORT_BURST * 4 / BURST_SHARE)
    assert 4 * RETRY_STEPS < wait < 8 * RETRY_STEPS
    assert waits == [wait - 1] * 3 + [8 * RETRY_STEPS - 1]


def test_while_speculation_wins_plain_steps_are_looked_at_every_recheck_steps() -> None:
    clock = Clock()
    guard = SpeculationGuard(clock)
    kinds = run(guard, clock, len(EXPLORE) + 2 * (RECHECK_STEPS + BURST_STEPS[PLAIN]), 1, spec_cost=1.2,
                spec_accepted=2)[len(EXPLORE):]
    assert starts(kinds, False) == [RECHECK_STEPS - 1, 2 * RECHECK_STEPS + BURST_STEPS[PLAIN] - 2]
    assert kinds.count(False) == 2 * BURST_STEPS[PLAIN]


def test_speculation_comes_back_when_its_drafts_start_to_be_accepted() -> None:
    clock = Clock()
    guard = SpeculationGuard(clock)
    run(guard, clock, len(EXPLORE) + 10, 1, spec_cost=2.0, spec_accepted=0)  # a request's first tokens: no drafts taken
    kinds = run(guard, clock, RETRY_STEPS + 60, 1, spec_cost=1.2, spec_accepted=3)  # later: 4 tokens in 1.2 s
    assert kinds[-30:] == [True] * 30


def test_steps_beside_prompts_idle_gaps_and_switches_are_not_recorded() -> None:
    clock = Clock()
    guard = SpeculationGuard(clock)
    guard.begin_step(3, steady=True)
    clock.now += 100.0  # an idle wait, then prompts join: the next step runs 3 decoding rows and a prompt
    guard.begin_step(3, steady=False)
    clock.now += 50.0
    guard.begin_step(4, steady=True)  # another count of decoding sequences
    clock.now += 1.0
    guard.begin_step(4, steady=True, eligible=False)  # none of them may draft (a plain step whatever the guard)
    clock.now += 70.0
    assert guard.begin_step(4, steady=True) is False  # after a step where none may draft: not recorded
    assert guard.tokens_per_s(3) is None and guard.tokens_per_s(4) is None
    for _ in range(MIN_SAMPLES[PLAIN] - 1):
        clock.now += 1.0
        assert guard.begin_step(4, steady=True) is False
    clock.now += 1.0
    assert guard.begin_step(4, steady=True) is True  # enough recorded (1 s, 4 tokens each): speculation next
    rates = guard._rates[4]
    assert rates.samples == [MIN_SAMPLES[PLAIN], 0] and rates.rate(False) == 4.0
    for _ in range(SHORT_BURST - 1):
        clock.now += 2.0
        assert guard.begin_step(4, steady=True) is True
    clock.now += 2.0
    assert guard.begin_step(4, steady=True) is False  # far behind (2 s, 4 tokens each): plain steps next
    assert rates.samples == [MIN_SAMPLES[PLAIN], SHORT_BURST] and rates.rate(True) == 2.0
    clock.now += 0.1  # the first plain step after speculation launched ahead: not recorded
    assert guard.begin_step(4, steady=True) is False
    clock.now += 1.0
    assert guard.begin_step(4, steady=True) is False
    assert rates.samples == [MIN_SAMPLES[PLAIN] + 1, SHORT_BURST] and rates.rate(False) == 4.0


def test_the_first_speculating_step_after_plain_ones_is_charged_to_speculation() -> None:
    clock = Clock()
    guard = SpeculationGuard(clock)
    run(guard, clock, len(EXPLORE) + 5, 1, spec_cost=1.0, spec_accepted=0)  # speculation gains nothing: plain wins
    while not guard.begin_step(1, steady=True):  # plain steps until speculation is retried
        clock.now += 1.0
    rates = guard._rates[1]
    before = rates.seconds[SPEC], rates.samples[SPEC]
    clock.now += 9.0  # the switch's step is slow (a draft model catching up): its time counts with speculation's
    guard.begin_step(1, steady=True)
    assert rates.samples[SPEC] == before[1] + 1
    assert rates.seconds[SPEC] == pytest.approx((1 - 1 / WINDOW) * before[0] + 9.0)
