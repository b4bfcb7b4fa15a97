"""MeasuredPolicy (runtime/speculative/policy.py) on a fake clock: it tries speculation, then plain steps, keeps the
kind that emits more tokens per second at each number of decoding sequences, re-measures the other now and then,
and never charges a step with time that is not its own."""

from __future__ import annotations

from runtime.speculative.policy import BURST_STEPS, MIN_SAMPLES, REFRESH_STEPS, MeasuredPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(policy: MeasuredPolicy, clock: Clock, steps: int, decoding: int, spec_cost: float, spec_accepted: int,
        plain_cost: float = 1.0) -> list[bool]:
    """`steps` steady steps at `decoding` sequences: a speculating one takes `spec_cost` seconds and gets
    `spec_accepted` drafts accepted, a plain one `plain_cost`. Returns each step's kind."""
    kinds = []
    for _ in range(steps):
        kind = policy.begin_step(decoding, steady=True)
        if kind:
            policy.accepted(spec_accepted)
        clock.now += spec_cost if kind else plain_cost
        kinds.append(kind)
    return kinds


def test_tries_speculation_then_plain_then_keeps_the_faster_kind() -> None:
    for spec_cost, accepted, want in ((1.5, 4, True), (3.0, 4, False)):  # 8 tokens in 1.5 s or 3 s vs 4 in 1 s
        clock = Clock()
        policy = MeasuredPolicy(clock)
        kinds = run(policy, clock, 40, 4, spec_cost, accepted)
        # the first step of a kind is not recorded (its switch), then MIN_SAMPLES of each
        explore = [True] * (MIN_SAMPLES + 1) + [False] * (MIN_SAMPLES + 1)
        assert kinds[: len(explore)] == explore
        assert set(kinds[len(explore):]) == {want}
        plain, spec = policy.tokens_per_s(4)  # type: ignore[misc]
        assert plain == 4.0 and spec == 8 / spec_cost


def test_each_number_of_decoding_sequences_is_measured_on_its_own() -> None:
    clock = Clock()
    policy = MeasuredPolicy(clock)
    run(policy, clock, 40, 2, spec_cost=1.5, spec_accepted=3)  # at 2 sequences: 5 tokens in 1.5 s vs 2 in 1 s
    assert run(policy, clock, 40, 8, spec_cost=3.0, spec_accepted=3)[-1] is False  # at 8: 11 in 3 s vs 8 in 1 s
    assert run(policy, clock, 3, 2, spec_cost=1.5, spec_accepted=3) == [True] * 3
    assert policy.tokens_per_s(5) is None


def test_the_other_kind_is_measured_again_every_refresh_steps() -> None:
    clock = Clock()
    policy = MeasuredPolicy(clock)
    kinds = run(policy, clock, 2 * (MIN_SAMPLES + 1) + 2 * (REFRESH_STEPS + BURST_STEPS), 1, spec_cost=3.0,
                spec_accepted=1)
    settled = kinds[2 * (MIN_SAMPLES + 1):]
    runs_of_speculation = [i for i, k in enumerate(settled) if k and (i == 0 or not settled[i - 1])]
    assert len(runs_of_speculation) == 2 and sum(settled) == 2 * BURST_STEPS
    # acceptance rose meanwhile: the re-measurement finds speculation faster now, and it takes over
    kinds = run(policy, clock, REFRESH_STEPS + BURST_STEPS + 20, 1, spec_cost=1.1, spec_accepted=4)
    assert kinds[-20:] == [True] * 20


def test_steps_beside_prompts_idle_gaps_and_switches_are_not_recorded() -> None:
    clock = Clock()
    policy = MeasuredPolicy(clock)
    policy.begin_step(3, steady=True)
    clock.now += 100.0  # an idle wait, then prompts join: the next step runs 3 decoding rows and a prompt
    policy.begin_step(3, steady=False)
    clock.now += 50.0
    policy.begin_step(4, steady=True)  # another count of decoding sequences
    clock.now += 1.0
    policy.begin_step(4, steady=True, eligible=False)  # none of them may draft (a plain step whatever the policy)
    clock.now += 70.0
    policy.begin_step(4, steady=True)
    assert policy.tokens_per_s(3) is None and policy.tokens_per_s(4) is None
    # speculating steps at 4 of 2 s each (4 tokens a step): the first follows a plain step and is not recorded
    for _ in range(MIN_SAMPLES):
        clock.now += 2.0
        assert policy.begin_step(4, steady=True) is True
    clock.now += 2.0
    assert policy.begin_step(4, steady=True) is False  # MIN_SAMPLES recorded: plain steps are measured next
    rates = policy._rates[4]
    assert rates.samples == [0, MIN_SAMPLES] and rates.tokens_per_s[1] == 2.0
