"""Scheduler: admission limits, chunked prefill, decode priority, preemption, guaranteed_no_evict, fork,
and a property test over random workloads, configurations and aborts.

A stand-in "model" makes the next token a pure function of the sequence so far, so a run that was
preempted and recomputed must end with exactly the tokens of an undisturbed run.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from runtime.native.block_manager import BlockManager
from runtime.config import SchedulerPolicy
from runtime.native.scheduler import ScheduledBatch, Scheduler
from runtime.native.sequence import Sequence, SequenceStatus

BS = 4


def next_token(tokens: list[int]) -> int:
    return hash(tuple(tokens)) % 97


def make_scheduler(
    num_blocks: int = 64,
    *,
    max_batch_size: int = 8,
    max_num_tokens: int = 64,
    policy: SchedulerPolicy = "max_utilization",
    chunked: bool = True,
    prefix_caching: bool = True,
) -> Scheduler:
    return Scheduler(
        BlockManager(num_blocks, BS, prefix_caching),
        max_batch_size=max_batch_size,
        max_num_tokens=max_num_tokens,
        policy=policy,
        enable_chunked_prefill=chunked,
    )


def step(sched: Scheduler) -> ScheduledBatch:
    """One engine iteration without a model: schedule, 'compute', sample, finish."""
    batch = sched.schedule()
    sched.advance(batch)
    for entry in batch.entries:
        seq = entry.seq
        if not entry.samples:
            continue
        seqs = [seq] + [sched.fork(seq, i) for i in range(1, seq.num_samples)]
        seq.num_samples = 1
        for s in seqs:
            s.append_token(next_token(s.token_ids + [s.index]))
            if s.num_tokens >= s.max_len:
                sched.finish(s)
    sched.block_manager.check_invariants(sched.running + list(sched.waiting))
    return batch


def run_to_completion(sched: Scheduler, seqs: list[Sequence], max_steps: int = 500) -> dict[int, list[int]]:
    for seq in seqs:
        sched.add(seq)
    done: dict[int, Sequence] = {}
    for _ in range(max_steps):
        if not sched.has_work():
            break
        batch = step(sched)
        for entry in batch.entries:
            done[entry.seq.seq_id] = entry.seq
        for s in sched.running:
            done[s.seq_id] = s
    assert not sched.has_work(), "requests were lost or starved"
    assert sched.block_manager.num_used_blocks == 0
    return {s.seq_id: s.output_token_ids for s in done.values()}


def prompt(n: int, start: int = 0) -> list[int]:
    return [(start + 7 * i) % 97 for i in range(n)]


def test_admission_respects_max_batch_size() -> None:
    sched = make_scheduler(max_batch_size=3)
    for i in range(5):
        sched.add(Sequence(f"r{i}", prompt(5, i), 4))
    batch = step(sched)
    assert len(batch.entries) == 3 and len(sched.running) == 3 and len(sched.waiting) == 2


def test_admission_respects_max_num_tokens_without_chunking() -> None:
    sched = make_scheduler(max_num_tokens=25, chunked=False)
    for i in range(3):
        sched.add(Sequence(f"r{i}", prompt(10, i), 4))
    batch = step(sched)
    assert [e.num_new_tokens for e in batch.entries] == [10, 10]
    batch = step(sched)  # two decodes + the third prompt
    assert sorted(e.num_new_tokens for e in batch.entries) == [1, 1, 10]


def test_chunked_prefill_splits_the_prompt_across_steps() -> None:
    sched = make_scheduler(max_num_tokens=8)
    seq = Sequence("r", prompt(30), 3)
    sched.add(seq)
    chunks = []
    while seq.num_computed_tokens < 30:
        batch = step(sched)
        chunks.append(batch.entries[0].num_new_tokens)
        assert batch.entries[0].is_prefill
        assert seq.num_output_tokens == (1 if seq.num_computed_tokens == 30 else 0)
    assert chunks == [8, 8, 8, 6]
    batch = step(sched)
    assert [(e.num_new_tokens, e.is_prefill) for e in batch.entries] == [(1, False)]


def test_decodes_are_scheduled_before_prompt_chunks() -> None:
    sched = make_scheduler(max_num_tokens=8)
    first = Sequence("a", prompt(3), 10)
    sched.add(first)
    step(sched)  # first is decoding now
    second = Sequence("b", prompt(20, 5), 3)
    sched.add(second)
    batch = step(sched)
    assert [(e.seq.request_id, e.num_new_tokens) for e in batch.entries] == [("a", 1), ("b", 7)]
    batch = step(sched)
    assert [(e.seq.request_id, e.num_new_tokens) for e in batch.entries] == [("a", 1), ("b", 7)]


def test_admission_stops_when_blocks_run_out() -> None:
    sched = make_scheduler(num_blocks=5)
    for i in range(3):
        sched.add(Sequence(f"r{i}", prompt(8, 10 * i), 2))  # 2 blocks each, +1 when decoding
    batch = step(sched)
    assert len(batch.entries) == 2 and len(sched.waiting) == 1


def test_preemption_loses_nothing_and_outputs_match_an_undisturbed_run() -> None:
    def workload() -> list[Sequence]:
        return [Sequence(f"r{i}", prompt(6 + 3 * i, i), 12 + i) for i in range(6)]

    roomy = make_scheduler(num_blocks=200)
    expected = run_to_completion(roomy, workload())
    assert roomy.num_preemptions == 0

    tight = make_scheduler(num_blocks=12)  # one longest sequence needs 8 blocks
    seqs = workload()
    got = run_to_completion(tight, seqs)
    assert tight.num_preemptions > 0
    assert sorted(got.values()) == sorted(expected.values())
    assert all(s.status is SequenceStatus.FINISHED and s.num_output_tokens == s.max_len - s.num_prompt_tokens for s in seqs)


def test_preempted_sequence_resumes_first_and_keeps_its_tokens() -> None:
    sched = make_scheduler(num_blocks=4, max_num_tokens=64)
    old = Sequence("old", prompt(7), 8)  # 2 blocks now, up to 4
    new = Sequence("new", prompt(7, 50), 8)
    sched.add(old)
    sched.add(new)
    step(sched)
    assert {s.request_id for s in sched.running} == {"old", "new"}
    # at 8 tokens both need a third block: 6 needed, 4 exist -> the newest is preempted
    while new.num_preemptions == 0:
        step(sched)
    assert new.status is SequenceStatus.WAITING and old.status is SequenceStatus.RUNNING
    assert sched.waiting[0] is new and new.block_table == [] and new.num_output_tokens == 2
    tokens_before = list(new.token_ids)
    while new.status is not SequenceStatus.RUNNING:
        step(sched)
    assert new.token_ids[: len(tokens_before)] == tokens_before


def test_guaranteed_no_evict_admits_only_worst_case_fits_and_never_preempts() -> None:
    # each request may grow to 8 + 8 = 16 tokens = 4 blocks; 6 blocks hold one worst case only
    sched = make_scheduler(num_blocks=6, policy="guaranteed_no_evict")
    seqs = [Sequence(f"r{i}", prompt(8, i), 8) for i in range(3)]
    for s in seqs:
        sched.add(s)
    step(sched)
    assert len(sched.running) == 1 and len(sched.waiting) == 2
    while sched.has_work():
        step(sched)
        assert len(sched.running) <= 1
    assert sched.num_preemptions == 0
    assert all(s.num_output_tokens == 8 for s in seqs)


def test_max_utilization_admits_what_guaranteed_no_evict_holds_back() -> None:
    sched = make_scheduler(num_blocks=6, policy="max_utilization")
    seqs = [Sequence(f"r{i}", prompt(8, i), 8) for i in range(3)]
    for s in seqs:
        sched.add(s)
    step(sched)
    assert len(sched.running) == 3  # the prompts fit now; growth is paid for with preemption later
    while sched.has_work():
        step(sched)
    assert sched.num_preemptions > 0
    assert all(s.num_output_tokens == 8 for s in seqs)


def test_fork_shares_prompt_blocks() -> None:
    sched = make_scheduler()
    seq = Sequence("r", prompt(10), 4, num_samples=3)
    sched.add(seq)
    batch = step(sched)
    assert batch.entries[0].num_new_tokens == 10  # the prompt runs once for all three samples
    samples = sorted(sched.running, key=lambda s: s.index)
    assert [s.index for s in samples] == [0, 1, 2]
    assert all(s.block_table == samples[0].block_table for s in samples)
    assert sched.block_manager.num_used_blocks == 3  # 10 tokens: 3 blocks, shared
    batch = step(sched)
    assert len(batch.copies) == 2  # two of the three copy the shared partial block before writing
    tails = {s.block_table[2] for s in samples}
    assert len(tails) == 3 and len({s.block_table[0] for s in samples}) == 1


def test_finish_and_abort_free_blocks() -> None:
    sched = make_scheduler()
    a, b = Sequence("a", prompt(9), 5), Sequence("b", prompt(9, 3), 5)
    sched.add(a)
    sched.add(b)
    step(sched)
    sched.finish(a)  # abort a running sequence
    c = Sequence("c", prompt(5), 5)
    sched.add(c)
    sched.finish(c)  # abort a waiting sequence
    sched.finish(b)
    assert not sched.has_work() and sched.block_manager.num_used_blocks == 0


def test_parked_sequences_are_skipped_and_freed_only_when_they_block_everything() -> None:
    """A beam waiting for its siblings' logits (nothing to compute) is never scheduled; when it holds the
    blocks a queued sequence needs and nothing else can run, it is freed to the back of the queue."""
    sched = make_scheduler(4, max_batch_size=2)
    parked = Sequence("beam", prompt(12), 4)
    sched.add(parked)
    sched.advance(sched.schedule())  # its 3 blocks computed, no token appended: parked
    assert parked.num_uncomputed_tokens == 0
    assert not sched.schedule() and parked.status is SequenceStatus.RUNNING  # skipped, kept

    sibling = Sequence("beam", prompt(8, 1), 4)  # needs 2 blocks, 1 is free
    sched.add(sibling)
    batch = sched.schedule()
    assert [e.seq for e in batch.entries] == [sibling] and batch.entries[0].num_new_tokens == 8
    assert parked.status is SequenceStatus.WAITING and list(sched.waiting) == [parked]
    assert parked.block_table == [] and parked.num_uncomputed_tokens == 12 and sched.num_preemptions == 1
    sched.block_manager.check_invariants(sched.running + list(sched.waiting))


# ---- property: any workload, any configuration -------------------------------------------------------

Request = tuple[int, int, int, int]  # (prompt length, max_tokens, samples, alphabet seed)


def run_workload(sched: Scheduler, requests: list[Request], aborts: dict[int, int],
                 max_steps: int = 3000) -> tuple[dict[tuple[str, int], Sequence], set[str]]:
    """Run `requests` to the end, aborting request `aborts[step]` at that step; checks every step's limits.

    Returns every sequence by (request id, sample index) and the ids of the aborted requests."""
    seqs: dict[tuple[str, int], Sequence] = {}
    for i, (length, max_tokens, samples, seed) in enumerate(requests):
        seq = Sequence(f"r{i}", [(seed * 7 + 3 * j) % 5 for j in range(length)], max_tokens, num_samples=samples)
        seqs[(seq.request_id, 0)] = seq
        sched.add(seq)
    aborted: set[str] = set()
    for n in range(max_steps):
        if not sched.has_work():
            break
        if n in aborts:
            rid = f"r{aborts[n] % len(requests)}"
            for seq in [s for (r, _), s in seqs.items() if r == rid and s.status is not SequenceStatus.FINISHED]:
                sched.finish(seq)
                aborted.add(rid)
        batch = step(sched)  # checks block conservation
        assert len(batch.entries) <= sched.max_batch_size and batch.num_tokens <= sched.max_num_tokens
        for s in [e.seq for e in batch.entries] + sched.running:
            seqs[(s.request_id, s.index)] = s
    assert not sched.has_work(), "requests were lost or starved"
    assert sched.block_manager.num_used_blocks == 0
    return seqs, aborted


@settings(max_examples=60, deadline=None)
# Pinned cases: three requests that must preempt each other, and forked samples with an abort on top.
@example(requests=[(8, 12, 1, 0), (8, 12, 1, 1), (8, 12, 1, 2)], max_batch_size=4, max_num_tokens=32,
         spare_blocks=0, policy="max_utilization", chunked=True, prefix_caching=False, aborts={})
@example(requests=[(9, 10, 2, 0), (5, 14, 1, 1), (12, 6, 2, 1)], max_batch_size=3, max_num_tokens=8,
         spare_blocks=1, policy="max_utilization", chunked=True, prefix_caching=True, aborts={6: 1})
@given(
    requests=st.lists(st.tuples(st.integers(1, 20), st.integers(1, 16), st.integers(1, 2), st.integers(0, 3)),
                      min_size=2, max_size=10),
    max_batch_size=st.integers(1, 6),
    max_num_tokens=st.integers(4, 32),
    spare_blocks=st.integers(0, 4),
    policy=st.sampled_from(["max_utilization", "guaranteed_no_evict"]),
    chunked=st.booleans(),
    prefix_caching=st.booleans(),
    aborts=st.dictionaries(st.integers(0, 40), st.integers(0, 7), max_size=3),
)
def test_any_workload_finishes_with_the_tokens_of_an_undisturbed_run(
        requests: list[Request], max_batch_size: int, max_num_tokens: int, spare_blocks: int,
        policy: SchedulerPolicy, chunked: bool, prefix_caching: bool, aborts: dict[int, int]) -> None:
    """Whatever the workload, limits, policy and aborts: every step stays within max_batch_size,
    max_num_tokens and the block pool (blocks conserved), nothing is lost or starved, every request not
    aborted ends with exactly max_tokens tokens per sample, equal to a run with room to spare, and all
    blocks come back."""
    longest_prompt = max(length for length, *_ in requests)
    if not chunked:  # without chunking a prompt must fit one step's token budget
        max_num_tokens = max(max_num_tokens, longest_prompt)
    # the pool holds at least the largest request's worst case, so each request can always finish alone
    worst = max(samples * -(-(length + max_tokens) // BS) for length, max_tokens, samples, _ in requests)
    tight = make_scheduler(worst + 1 + spare_blocks, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
                           policy=policy, chunked=chunked, prefix_caching=prefix_caching)
    got, aborted = run_workload(tight, requests, aborts)
    roomy = make_scheduler(1000, max_batch_size=64, max_num_tokens=1000)
    want, _ = run_workload(roomy, requests, {})
    for (rid, index), seq in got.items():
        if rid in aborted:
            continue
        assert seq.status is SequenceStatus.FINISHED and seq.num_output_tokens == seq.max_len - seq.num_prompt_tokens
        assert seq.output_token_ids == want[(rid, index)].output_token_ids
    finished = {(rid, i) for (rid, i) in got if rid not in aborted}
    assert finished == {(rid, i) for (rid, i) in want if rid not in aborted}  # every sample of every request
