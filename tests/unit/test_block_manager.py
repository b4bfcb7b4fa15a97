"""BlockManager: allocation, reference counts, prefix caching, fork with copy-on-write, conservation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.native.block_manager import BlockManager
from runtime.native.block_tables import BlockTables
from runtime.native.sequence import Sequence

BS = 4


def make_seq(tokens: list[int], max_tokens: int = 8, salt: str | None = None) -> Sequence:
    return Sequence("r", tokens, max_tokens, cache_salt=salt)


def run_prefill(bm: BlockManager, seq: Sequence) -> list[tuple[int, int]]:
    """Admit `seq` like the scheduler does: attach cache hits, compute the rest, commit."""
    bm.attach_prefix(seq, bm.find_cached_prefix(seq))
    copies = bm.append_slots(seq, seq.num_uncomputed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    advance(bm, seq)
    return copies


def advance(bm: BlockManager, seq: Sequence) -> None:
    """What Scheduler.advance does once a step computed `seq`'s tokens."""
    bm.commit(seq)
    bm.release_outside_window(seq)


def decode(bm: BlockManager, seq: Sequence, token: int) -> list[tuple[int, int]]:
    """Append a sampled token and compute it (one decode step)."""
    seq.append_token(token)
    copies = bm.append_slots(seq, 1)
    seq.num_computed_tokens += 1
    bm.commit(seq)
    return copies


def test_allocate_append_free_counts() -> None:
    bm = BlockManager(8, BS)
    seq = make_seq(list(range(10)))
    assert bm.blocks_needed(seq, 10) == 3
    run_prefill(bm, seq)
    assert len(seq.block_table) == 3 and bm.num_used_blocks == 3 and bm.num_free_blocks == 5
    decode(bm, seq, 100)  # position 10: still block 2
    decode(bm, seq, 101)  # position 11: block 2 now full
    assert len(seq.block_table) == 3
    decode(bm, seq, 102)  # position 12: a fourth block
    assert len(seq.block_table) == 4 and bm.num_used_blocks == 4
    bm.free(seq)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == 8 and seq.block_table == []
    bm.check_invariants([])


def test_can_append_refuses_past_capacity() -> None:
    bm = BlockManager(2, BS)
    seq = make_seq(list(range(9)))
    assert not bm.can_append(seq, 9)
    assert bm.can_append(seq, 8)


def test_prefix_hit_reuses_computed_full_blocks_only() -> None:
    bm = BlockManager(16, BS)
    first = make_seq(list(range(10)))  # blocks [0-3] [4-7] full, [8-9] partial
    run_prefill(bm, first)
    assert bm.num_cached_blocks == 2
    second = make_seq(list(range(10)) + [50, 51])
    hits = bm.find_cached_prefix(second)
    assert hits == first.block_table[:2]
    run_prefill(bm, second)
    assert second.block_table[:2] == first.block_table[:2]
    assert second.block_table[2] != first.block_table[2]  # the partial block is never shared by hash
    assert [bm.ref_counts[b] for b in first.block_table[:2]] == [2, 2]
    bm.check_invariants([first, second])


def test_prefix_hit_leaves_last_token_to_compute() -> None:
    bm = BlockManager(16, BS)
    run_prefill(bm, make_seq(list(range(8))))
    # identical 8-token prompt: only the first block may hit, the last token must run for its logits
    assert len(bm.find_cached_prefix(make_seq(list(range(8))))) == 1
    assert len(bm.find_cached_prefix(make_seq(list(range(9))))) == 2


def test_prefix_chain_and_salt() -> None:
    bm = BlockManager(16, BS)
    run_prefill(bm, make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    # same second block after a different first block: the chained hash must not match
    assert bm.find_cached_prefix(make_seq([0, 2, 3, 4, 5, 6, 7, 8, 9])) == []
    assert bm.find_cached_prefix(make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9], salt="adapter-a")) == []


def test_uncommitted_blocks_are_not_hits() -> None:
    bm = BlockManager(16, BS)
    seq = make_seq(list(range(12)))
    bm.append_slots(seq, 12)  # allocated but not computed yet
    assert bm.find_cached_prefix(make_seq(list(range(13)))) == []


def test_freed_cached_blocks_are_reused_until_evicted() -> None:
    bm = BlockManager(4, BS)
    a = make_seq(list(range(9)))
    run_prefill(bm, a)  # 3 blocks, the 2 full ones cached
    table = list(a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    again = make_seq(list(range(9)))
    assert bm.find_cached_prefix(again) == table[:2]
    run_prefill(bm, again)
    assert again.block_table[:2] == table[:2]
    bm.free(again)
    # a prompt sharing nothing needs all 4 blocks: the cached ones are taken and forgotten
    other = make_seq(list(range(100, 116)))
    run_prefill(bm, other)
    assert bm.num_free_blocks == 0
    assert bm.find_cached_prefix(make_seq(list(range(9)))) == []
    bm.check_invariants([other])


def test_lru_evicts_least_recently_freed_cached_block_first() -> None:
    bm = BlockManager(5, BS)
    old, new = make_seq([1] * 5), make_seq([2] * 5)  # one full (cached) + one partial block each
    run_prefill(bm, old)
    run_prefill(bm, new)
    bm.free(old)
    bm.free(new)
    # 4 blocks: the 3 uncached free blocks go first, then the least recently freed cached one
    run_prefill(bm, make_seq(list(range(100, 116))))
    assert bm.find_cached_prefix(make_seq([1] * 5)) == []
    assert len(bm.find_cached_prefix(make_seq([2] * 5))) == 1


def test_fork_shares_blocks_and_copies_partial_block_on_write() -> None:
    bm = BlockManager(16, BS)
    parent = make_seq(list(range(6)))  # block 0 full, block 1 holds 2 of 4
    run_prefill(bm, parent)
    child = parent.fork(1)
    bm.fork(child)
    assert child.block_table == parent.block_table
    assert all(bm.ref_counts[b] == 2 for b in parent.block_table)
    used = bm.num_used_blocks
    shared_tail = parent.block_table[1]
    copies = decode(bm, child, 7)
    assert copies == [(shared_tail, child.block_table[1])]
    assert child.block_table[0] == parent.block_table[0] and child.block_table[1] != shared_tail
    assert bm.num_used_blocks == used + 1 and bm.ref_counts[shared_tail] == 1
    assert decode(bm, parent, 8) == []  # now the only owner: writes in place
    bm.check_invariants([parent, child])
    bm.free(parent)
    bm.free(child)
    assert bm.num_used_blocks == 0
    bm.check_invariants([])


def test_fork_on_block_boundary_needs_no_copy() -> None:
    bm = BlockManager(16, BS)
    parent = make_seq(list(range(8)))
    run_prefill(bm, parent)
    child = parent.fork(1)
    bm.fork(child)
    assert bm.blocks_needed(child, 1) == 1
    assert decode(bm, child, 9) == []
    assert child.block_table[:2] == parent.block_table[:2] and len(child.block_table) == 3


def test_blocks_needed_counts_copy_on_write_and_revived_cache_blocks() -> None:
    bm = BlockManager(8, BS)
    parent = make_seq(list(range(6)))
    run_prefill(bm, parent)
    child = parent.fork(1)
    bm.fork(child)
    child.append_token(1)
    assert bm.blocks_needed(child, 1) == 1  # the copy of the shared partial block
    bm.free(parent)
    bm.free(child)
    seq = make_seq(list(range(6)))
    cached = bm.find_cached_prefix(seq)
    assert len(cached) == 1 and bm.blocks_needed(seq, 2, cached) == 2  # revive 1 + grow 1


OPS = ["new", "decode", "speculate", "fork", "free", "preempt", "resume"]


@pytest.mark.parametrize("window", [None, 6])
@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 10**6)), max_size=60))
def test_conservation_under_random_operations(window: int | None, ops: list[tuple[str, int]]) -> None:
    """Whatever happens (allocate, decode, speculate, fork, free, preempt, resume), every block is free, evictable or
    referenced exactly as often as it is used, a preempted sequence holds none, and every live sequence's resident
    block table (runtime/native/block_tables.py) equals its list (check_invariants); with a sliding window (every layer's)
    too, as blocks behind it are given back."""
    bm = BlockManager(24, BS, window=window)
    live: list[Sequence] = []
    paused: list[Sequence] = []  # preempted as the scheduler does: blocks freed, tokens kept
    for op, r in ops:
        if op == "new":
            # prompts from a small alphabet, so prefix hits happen
            tokens = [(r >> (2 * i)) % 3 for i in range(1 + r % 11)]
            seq = make_seq(tokens)
            cached = bm.find_cached_prefix(seq)
            if bm.can_append(seq, seq.num_tokens - len(cached) * BS, cached):
                run_prefill(bm, seq)
                live.append(seq)
        elif op == "decode" and live:
            seq = live[r % len(live)]
            seq.append_token(r % 3)
            if bm.can_append(seq, 1):
                bm.append_slots(seq, 1)
                seq.num_computed_tokens += 1
                advance(bm, seq)
            else:
                seq.token_ids.pop()
        elif op == "speculate" and live:  # room for 1 + k tokens, then only the verified ones keep theirs
            seq = live[r % len(live)]
            k, accepted = r % 5, (r // 5) % (r % 5 + 1)
            seq.append_token(r % 3)
            if bm.can_append(seq, 1 + k):
                bm.append_slots(seq, 1 + k)
                seq.token_ids.extend([r % 3] * accepted)
                bm.trim(seq, seq.num_computed_tokens + 1 + accepted)
                seq.num_computed_tokens += 1 + accepted
                advance(bm, seq)
            else:
                seq.token_ids.pop()
        elif op == "fork" and live:
            child = live[r % len(live)].fork(len(live))
            bm.fork(child)
            live.append(child)
        elif op == "free" and live:
            bm.free(live.pop(r % len(live)))
        elif op == "preempt" and live:
            seq = live.pop(r % len(live))
            tokens = list(seq.token_ids)
            bm.free(seq)
            assert seq.block_table == [] and seq.num_computed_tokens == 0 and seq.token_ids == tokens
            paused.append(seq)
        elif op == "resume" and paused:
            seq = paused[r % len(paused)]
            cached = bm.find_cached_prefix(seq)  # recompute prompt + generated tokens, prefix hits reused
            if bm.can_append(seq, seq.num_tokens - len(cached) * BS, cached):
                run_prefill(bm, seq)
                paused.remove(seq)
                live.append(seq)
        bm.check_invariants(live)
        assert bm.num_used_blocks == len({b for s in live for b in s.block_table[s.num_released_blocks :]})
        assert all(not s.block_table for s in paused)
    for seq in live:
        bm.free(seq)
    bm.check_invariants([])
    assert bm.num_free_blocks == 24


def test_blocks_behind_the_window_are_given_back_and_stay_cached() -> None:
    """Every layer sliding with a window of 6: after 14 tokens the next one sees tokens 9..14, so blocks 0 and 1
    (tokens 0..7) go back, into the prefix cache; a fork shares only the kept blocks; free gives back the rest."""
    bm = BlockManager(16, BS, window=6)
    seq = make_seq(list(range(14)))
    run_prefill(bm, seq)
    assert seq.num_released_blocks == 2 and bm.num_used_blocks == 2  # blocks 2 and 3 (tokens 8..13)
    assert bm.num_cached_blocks == 3  # the three full blocks, released ones included
    child = seq.fork(1)
    bm.fork(child)
    bm.check_invariants([seq, child])
    again = make_seq(list(range(14)))
    assert bm.find_cached_prefix(again) == seq.block_table[:3]  # released blocks still serve a new request
    for s in (seq, child):
        bm.free(s)
    bm.check_invariants([])
    assert bm.num_free_blocks == 16


def test_invariant_checker_detects_a_leak() -> None:
    bm = BlockManager(4, BS)
    seq = make_seq([1, 2, 3])
    run_prefill(bm, seq)
    with pytest.raises(AssertionError):
        bm.check_invariants([])  # the live sequence was "forgotten"


def test_resident_tables_grow_and_reuse_rows() -> None:
    tables = BlockTables(rows=2, width=2)
    seqs = [make_seq([1]) for _ in range(3)]
    for i, seq in enumerate(seqs):
        seq.block_table = list(range(10 * i, 10 * i + 3 + i))
        tables.write(seq)
    assert [tables.row(s) for s in seqs] == [s.block_table for s in seqs] and tables.matrix.shape == (4, 8)
    assert [s.table_row for s in seqs] == [0, 1, 2] and tables.rows_in_use == 3
    tables.release(seqs[0])
    seqs[2].block_table.append(99)
    tables.write(seqs[2], 5)  # a diff: only the new entry
    again = make_seq([2])
    again.block_table = [7]
    tables.write(again)
    assert again.table_row == 0 and tables.row(again) == [7] and tables.row(seqs[2]) == [20, 21, 22, 23, 24, 99]
