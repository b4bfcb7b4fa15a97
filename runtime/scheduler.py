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


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # tokens computed this step: num_computed_tokens .. + num_new_tokens - 1
    is_prefill: bool
    samples: bool  # the step reaches the end of the sequence's tokens, so its next token is sampled
    cached_tokens: int | None = None  # admitted this step: prompt tokens served from the prefix cache


@dataclass
class ScheduledBatch:
    entries: list[ScheduledSeq] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst) blocks
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(e.num_new_tokens for e in self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)


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
                batch.entries.append(ScheduledSeq(seq, 1, computed < seq.num_prompt_tokens, True))
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
            batch.entries[-1].cached_tokens = seq.num_computed_tokens
        return batch

    def advance(self, batch: ScheduledBatch) -> None:
        """Record that the batch ran: its tokens' K/V are now in the cache."""
        for entry in batch.entries:
            seq = entry.seq
            if seq.status is SequenceStatus.FINISHED:
                continue  # failed or aborted during the step
            seq.num_computed_tokens += entry.num_new_tokens
            self.block_manager.commit(seq)

    def _schedule(self, seq: Sequence, num_new: int, batch: ScheduledBatch, scheduled: set[int]) -> int:
        samples = num_new == seq.num_uncomputed_tokens
        batch.copies.extend(self.block_manager.append_slots(seq, num_new))
        batch.entries.append(ScheduledSeq(seq, num_new, seq.is_prefill, samples))
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
