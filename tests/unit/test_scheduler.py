"""Scheduler: admission limits, chunked prefill, decode priority, preemption, guaranteed_no_evict, fork.

A stand-in "model" makes the next token a pure function of the sequence so far, so a run that was
preempted and recomputed must end with exactly the tokens of an undisturbed run.
"""

from __future__ import annotations

from runtime.block_manager import BlockManager
from runtime.config import SchedulerPolicy
from runtime.scheduler import ScheduledBatch, Scheduler
from runtime.sequence import Sequence, SequenceStatus

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
