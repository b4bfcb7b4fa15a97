"""Scheduler: decides which sequences run in the next step and how many tokens each computes.

Each step, within `max_batch_size` sequences, `max_num_tokens` tokens and the free KV blocks:
  1. running sequences continue: decodes first (one token each), then unfinished prompt chunks;
  2. waiting sequences are admitted in arrival order (preempted ones first), their prompts split into
     chunks when `enable_chunked_prefill` and the prompt exceeds the remaining token budget.
Prefills and decodes share one step. Policies when blocks run short:
  "max_utilization"      admit while blocks last; when a running sequence cannot grow, preempt the
                         newest running one (free its blocks, re-queue it at the front; it recomputes
                         prompt + generated tokens when it resumes).
  "guaranteed_no_evict"  admit only when the request's worst case (prompt + max_tokens for each of its
                         samples) fits beside every admitted request's worst case; never preempts.
The scheduler knows blocks, not tensors; the model runner turns a ScheduledBatch into tensors.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from runtime.block_manager import BlockManager
from runtime.config import SchedulerPolicy
from runtime.sequence import Sequence, SequenceStatus

logger = logging.getLogger(__name__)


@dataclass
class ScheduledBatch:
    """One step's sequences as columns, in the order the step runs them (decodes first). A 256-row step makes no
    object per sequence; `entries` gives ScheduledSeq views for code that hands single entries around."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)  # tokens computed this step: num_computed_tokens .. + n - 1
    prefill: list[bool] = field(default_factory=list)  # Sequence.is_prefill when scheduled
    samples: list[bool] = field(default_factory=list)  # the step reaches the end of the tokens: the next one is sampled
    cached: dict[int, int] = field(default_factory=dict)  # entry admitted this step -> its prompt tokens served
    # from the prefix cache
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst) blocks
    preempted: list[Sequence] = field(default_factory=list)

    def add(self, seq: Sequence, num_new: int, is_prefill: bool, samples: bool) -> None:
        self.seqs.append(seq)
        self.num_new.append(num_new)
        self.prefill.append(is_prefill)
        self.samples.append(samples)

    @property
    def entries(self) -> list[ScheduledSeq]:
        return [ScheduledSeq(self, i) for i in range(len(self.seqs))]

    def drop_finished(self) -> None:
        """Drop the entries whose sequence finished (ended while the step in flight was collected)."""
        keep = [i for i, seq in enumerate(self.seqs) if seq.status is not SequenceStatus.FINISHED]
        if len(keep) == len(self.seqs):
            return
        self.cached = {new: self.cached[old] for new, old in enumerate(keep) if old in self.cached}
        for column in (self.seqs, self.num_new, self.prefill, self.samples):
            column[:] = [column[i] for i in keep]

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new)

    def __len__(self) -> int:
        return len(self.seqs)


class ScheduledSeq:
    """Entry `i` of a ScheduledBatch, read from and written to its columns (speculative verification shortens an
    entry to the tokens it accepted)."""

    __slots__ = ("_batch", "_i")

    def __init__(self, batch: ScheduledBatch, i: int) -> None:
        self._batch, self._i = batch, i

    @property
    def seq(self) -> Sequence:
        return self._batch.seqs[self._i]

    @property
    def num_new_tokens(self) -> int:
        return self._batch.num_new[self._i]

    @num_new_tokens.setter
    def num_new_tokens(self, value: int) -> None:
        self._batch.num_new[self._i] = value

    @property
    def is_prefill(self) -> bool:
        return self._batch.prefill[self._i]

    @property
    def samples(self) -> bool:
        return self._batch.samples[self._i]

    @property
    def cached_tokens(self) -> int | None:
        """Admitted this step: prompt tokens served from the prefix cache."""
        return self._batch.cached.get(self._i)


class Scheduler:
    """Waiting and running queues over a BlockManager."""

    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_batch_size: int,
        max_num_tokens: int,
        policy: SchedulerPolicy = "max_utilization",
        enable_chunked_prefill: bool = True,
    ) -> None:
        if policy not in ("max_utilization", "guaranteed_no_evict"):
            raise ValueError(f"unknown scheduler_policy {policy!r}")
        self.block_manager = block_manager
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.policy = policy
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last one is the newest
        self.num_preemptions = 0

    # ---- queues -------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        """Sequences never scheduled yet (preempted ones are counted by num_paused)."""
        return sum(1 for s in self.waiting if s.num_preemptions == 0)

    @property
    def num_paused(self) -> int:
        return sum(1 for s in self.waiting if s.num_preemptions > 0)

    def fork(self, parent: Sequence, index: int) -> Sequence:
        """A running copy of `parent` for sample `index`, sharing its blocks."""
        child = parent.fork(index)
        self.block_manager.fork(child)
        child.status = SequenceStatus.RUNNING
        self.running.append(child)
        return child

    def finish(self, seq: Sequence) -> None:
        """Remove `seq` from whichever queue holds it and free its blocks (finish or abort)."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED

    # ---- one step -----------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        """Pick this step's sequences and allocate their blocks."""
        batch = ScheduledBatch()
        scheduled: set[int] = set()
        budget = self.max_num_tokens

        # Decodes before unfinished prompt chunks, so a long prompt never starves ongoing streams.
        bs, ref_counts = self.block_manager.block_size, self.block_manager.ref_counts
        for seq in sorted(self.running, key=lambda s: len(s.token_ids) - s.num_computed_tokens > 1):
            uncomputed = len(seq.token_ids) - seq.num_computed_tokens
            if seq.status is not SequenceStatus.RUNNING or uncomputed == 0:
                continue  # preempted earlier in this loop, or a beam waiting for its siblings' logits
            if budget == 0 or len(scheduled) == self.max_batch_size:
                break
            computed = seq.num_computed_tokens
            if uncomputed == 1 and computed % bs and ref_counts[seq.block_table[computed // bs]] == 1:
                # the common decode: its token goes into its own last block, which has room (no allocation)
                batch.add(seq, 1, computed < seq.num_prompt_tokens, True)
                scheduled.add(seq.seq_id)
                budget -= 1
                continue
            num_new = min(uncomputed, budget)
            if not self._make_room(seq, num_new, scheduled, batch):
                continue
            budget -= self._schedule(seq, num_new, batch, scheduled)

        # A step that had to preempt admits nothing: the pool is already too small.
        while self.waiting and not batch.preempted and budget > 0:
            seq = self.waiting[0]
            # a request fanning out wider than a batch (beam_width > max_batch_size) waits for an empty one
            if len(self.running) + min(seq.fanout, self.max_batch_size) > self.max_batch_size:
                if not batch and self._evict_parked():
                    continue
                break
            cached = self.block_manager.find_cached_prefix(seq)
            num_new = seq.num_tokens - len(cached) * self.block_manager.block_size
            if num_new > budget:
                # Chunking is always allowed when resuming: the prompt alone fitted once already.
                if not (self.enable_chunked_prefill or seq.num_preemptions):
                    break
                num_new = budget
            if self.policy == "guaranteed_no_evict" and not self._fits_worst_case(seq):
                break
            if not self.block_manager.can_append(seq, num_new, cached):
                if not batch and self._evict_parked():
                    continue
                break
            self.waiting.popleft()
            self.block_manager.attach_prefix(seq, cached)
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = seq.num_computed_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            budget -= self._schedule(seq, num_new, batch, scheduled)
            batch.cached[len(batch) - 1] = seq.num_computed_tokens
        return batch

    def advance(self, batch: ScheduledBatch) -> None:
        """Record that the batch ran: its tokens' K/V are now in the cache."""
        bm = self.block_manager
        bs = bm.block_size
        for seq, num_new in zip(batch.seqs, batch.num_new):
            if seq.status is SequenceStatus.FINISHED:
                continue  # failed or aborted during the step
            seq.num_computed_tokens += num_new
            if seq.num_computed_tokens >= (seq.num_committed_blocks + 1) * bs:  # a block filled up (else a no-op)
                bm.commit(seq)
                bm.release_outside_window(seq)

    def _schedule(self, seq: Sequence, num_new: int, batch: ScheduledBatch, scheduled: set[int]) -> int:
        samples = num_new == seq.num_uncomputed_tokens
        batch.copies.extend(self.block_manager.append_slots(seq, num_new))
        batch.add(seq, num_new, seq.is_prefill, samples)
        scheduled.add(seq.seq_id)
        return num_new

    def _make_room(self, seq: Sequence, num_new: int, scheduled: set[int], batch: ScheduledBatch) -> bool:
        """Preempt the newest unscheduled running sequences until `seq` can grow; False if `seq` was."""
        while not self.block_manager.can_append(seq, num_new):
            if self.policy == "guaranteed_no_evict":
                logger.warning("guaranteed_no_evict ran out of KV blocks; preempting to stay live")
            victim = next(s for s in reversed(self.running) if s.seq_id not in scheduled)
            self._preempt(victim, batch)
            if victim is seq:
                return False
        return True

    def _evict_parked(self) -> bool:
        """Nothing could run: free the newest beam waiting for its siblings' logits (runtime/beam_search.py).

        Parked beams hold slots and blocks but have nothing to compute; when a sibling they wait for is
        queued behind them, freeing one is the only way forward. It goes to the back of the queue (its
        logits are already recorded) and recomputes its tokens when readmitted. False: none parked.
        """
        for seq in reversed(self.running):
            if seq.num_uncomputed_tokens == 0:
                self._release(seq)
                self.waiting.append(seq)
                return True
        return False

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self._release(seq)
        # Victims come newest first; each goes in front of the previous, so the oldest resumes first.
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)

    def _release(self, seq: Sequence) -> None:
        """Take a running `seq` out of the batch and free its blocks; it recomputes when readmitted."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1

    def _fits_worst_case(self, seq: Sequence) -> bool:
        """guaranteed_no_evict: free blocks cover every running sequence's and `seq`'s worst case."""
        reserved = sum(self._future_blocks(s) for s in self.running)
        need = seq.fanout * self.block_manager.blocks_for(seq.max_len)
        return self.block_manager.num_free_blocks - reserved >= need

    def _future_blocks(self, seq: Sequence) -> int:
        """An upper bound of the free blocks `seq` (and the samples it will fork into) may still take."""
        bm = self.block_manager
        most = bm.blocks_for(seq.max_len)
        if seq.fanout > 1:
            # each fork may grow to `most` blocks and copy the shared last block
            return seq.fanout * most - len(seq.block_table)
        shared_tail = (
            seq.num_computed_tokens % bm.block_size != 0 and bool(seq.block_table) and bm.ref_counts[seq.block_table[-1]] > 1
        )
        return most - len(seq.block_table) + (1 if shared_tail else 0)
