"""SpeculationGuard (runtime/speculative/guard.py) on a fake clock: it speculates first, compares with plain steps,
keeps the faster kind at each number of decoding sequences, looks at the other kind again now and then (speculation
again after a wait that doubles while it keeps losing), and never charges a step with time that is not its own."""

from __future__ import annotations

from runtime.speculative.guard import (BURST_STEPS, MIN_SAMPLES, RECHECK_STEPS, RETRY_MAX_STEPS, RETRY_STEPS,
                                        SpeculationGuard)


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


EXPLORE = [True] * (MIN_SAMPLES + 1) + [False] * (MIN_SAMPLES + 1)  # a switch's first step is not recorded


def starts(kinds: list[bool], kind: bool) -> list[int]:
    """Indices where a run of `kind` begins."""
    return [i for i, k in enumerate(kinds) if k == kind and (i == 0 or kinds[i - 1] != kind)]


def test_speculates_first_then_compares_with_plain_steps_and_keeps_the_faster_kind() -> None:
    for spec_cost, accepted, want in ((1.5, 4, True), (3.0, 4, False)):  # 8 tokens in 1.5 s or 3 s vs 4 in 1 s
        clock = Clock()
        guard = SpeculationGuard(clock)
        kinds = run(guard, clock, 40, 4, spec_cost, accepted)
        assert kinds[: len(EXPLORE)] == EXPLORE
        assert set(kinds[len(EXPLORE):]) == {want}
        plain, spec = guard.tokens_per_s(4)  # type: ignore[misc]
        assert plain == 4.0 and spec == 8 / spec_cost


def test_each_number_of_decoding_sequences_is_measured_on_its_own() -> None:
    clock = Clock()
    guard = SpeculationGuard(clock)
    run(guard, clock, 40, 2, spec_cost=1.5, spec_accepted=3)  # at 2 sequences: 5 tokens in 1.5 s vs 2 in 1 s
    assert run(guard, clock, 40, 8, spec_cost=3.0, spec_accepted=3)[-1] is False  # at 8: 11 in 3 s vs 8 in 1 s
    assert run(guard, clock, 3, 2, spec_cost=1.5, spec_accepted=3) == [True] * 3
    assert guard.tokens_per_s(5) is None


def test_while_plain_steps_win_speculation_is_retried_after_a_doubling_wait() -> None:
    clock = Clock()
    guard = SpeculationGuard(clock)
    kinds = run(guard, clock, len(EXPLORE) + 8 * RETRY_STEPS, 1, spec_cost=3.0, spec_accepted=1)[len(EXPLORE):]
    retries = starts(kinds, True)
    waits = [retries[0]] + [b - a - BURST_STEPS for a, b in zip(retries, retries[1:])]
    assert waits[:3] == [RETRY_STEPS - 1, 2 * RETRY_STEPS - 1, 4 * RETRY_STEPS - 1]
    assert all(sum(kinds[i : i + BURST_STEPS]) == BURST_STEPS for i in retries)
    assert 2 * RETRY_STEPS <= RETRY_MAX_STEPS


def test_while_speculation_wins_plain_steps_are_looked_at_every_recheck_steps() -> None:
    clock = Clock()
    guard = SpeculationGuard(clock)
    kinds = run(guard, clock, len(EXPLORE) + 2 * (RECHECK_STEPS + BURST_STEPS), 1, spec_cost=1.2,
                spec_accepted=2)[len(EXPLORE):]
    assert starts(kinds, False) == [RECHECK_STEPS - 1, 2 * RECHECK_STEPS + BURST_STEPS - 2]
    assert kinds.count(False) == 2 * BURST_STEPS


def test_speculation_comes_back_when_its_drafts_start_to_be_accepted() -> None:
    clock = Clock()
    guard = SpeculationGuard(clock)
    run(guard, clock, len(EXPLORE) + 10, 1, spec_cost=2.0, spec_accepted=0)  # a request's first tokens: no drafts taken
    kinds = run(guard, clock, RETRY_STEPS + 40, 1, spec_cost=1.2, spec_accepted=3)  # later: 4 tokens in 1.2 s
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
    assert guard.begin_step(4, steady=True) is True  # after a plain step: not recorded
    assert guard.tokens_per_s(3) is None and guard.tokens_per_s(4) is None
    for _ in range(MIN_SAMPLES):
        clock.now += 2.0
        assert guard.begin_step(4, steady=True) is True
    clock.now += 2.0
    assert guard.begin_step(4, steady=True) is False  # MIN_SAMPLES recorded (2 s, 4 tokens each): plain steps next
    rates = guard._rates[4]
    assert rates.samples == [0, MIN_SAMPLES] and rates.tokens_per_s[1] == 2.0
