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

It is the only code that changes sequences and their blocks (vLLM v1's contract: `schedule()`, then
`update_from_output(batch, results)`): a step's sampled tokens, forks into n samples, finished samples, the
drafts speculation had accepted (runtime/native/speculative), the continuations a beam-search round chose
(runtime/native/beam_search.py) and the places held for tokens of a step still on the device are all applied here. The
request's own decisions (stop conditions, logprobs: runtime/native/request_state.py) come back as token-level deltas.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING

from runtime.native.block_manager import BlockManager
from runtime.config import SchedulerPolicy
from runtime.request import OutputDelta
from runtime.native.scheduled_batch import ScheduledBatch, ScheduledSeq
from runtime.native.sequence import PENDING_TOKEN, Sequence, SequenceStatus
from runtime.native.step_output import StepOutput

if TYPE_CHECKING:
    from runtime.native.request_state import RequestState
    from runtime.native.speculative.verifier import Verdict
    from runtime.native.step_results import StepResult, StepResults

logger = logging.getLogger(__name__)

# what `update_from_output` hands back per request: its deltas, and the error that failed its output (or None)
Produced = tuple["RequestState", list[OutputDelta], Exception | None]


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

    def reserve_slots(self, seq: Sequence, num_tokens: int) -> None:
        """Room in the cache for `seq`'s next `num_tokens` tokens (a decode that also scores speculative drafts; the
        speculator has checked that the blocks are free)."""
        self.block_manager.append_slots(seq, num_tokens)

    def hold_places(self, batch: ScheduledBatch) -> dict[int, int]:
        """The batch was launched and runs while the next step is prepared (async scheduling): it counts as computed,
        and each sequence it samples gets PENDING_TOKEN, so the next step can schedule it; not one whose sampled token
        is surely its last (max_tokens, context window). Returns each sampling sequence's row in the step's sampled
        ids (seq_id -> row), where the next step reads its token on the device."""
        self.advance(batch)
        rows: dict[int, int] = {}
        for seq, samples in zip(batch.seqs, batch.samples):
            if not samples:
                continue
            rows[seq.seq_id] = len(rows)
            # a finished sequence ended while the step was launched; max_len is within the context window
            if seq.status is not SequenceStatus.FINISHED and seq.num_tokens + 1 < seq.max_len:
                seq.token_ids.append(PENDING_TOKEN)
        return rows

    # ---- after a step -------------------------------------------------------------------------
    def update_from_output(self, batch: ScheduledBatch, results: StepResults, requests: Mapping[str, RequestState],
                           out: StepOutput, *, advanced: bool = False,
                           verdicts: Mapping[int, Verdict] | None = None) -> list[Produced]:
        """Apply a collected step: drafts that speculative `verdicts` accepted join their sequences (the slots of the
        rejected ones are freed), the step's tokens count as computed (unless `advanced` when it was launched),
        sampled tokens join their sequences, samples fork, beams grow, and finished samples free their blocks.

        A token of a request whose output is its ids (RequestState.add_plain_token) goes to `out` as is; for every
        other request comes back (request, its deltas, the error that failed its output or None): one request's
        broken output fails that request alone, and its later entries in the batch are skipped."""
        verifying = verdicts or {}
        for b, verdict in verifying.items():
            self._accept_drafts(ScheduledSeq(batch, b), verdict)
        if not advanced:
            self.advance(batch)
        produced: dict[str, Produced] = {}
        first_ids, prefill = results.first_ids(), batch.prefill
        for b, seq in enumerate(batch.seqs):
            state = requests.get(seq.request_id)
            if state is None or seq.status is SequenceStatus.FINISHED:
                continue
            done = produced.get(state.request_id)
            if done is not None and done[2] is not None:
                continue  # its output failed on an earlier entry
            try:
                if (state.token_only and not prefill[b] and (token_id := first_ids[b]) is not None
                        and b not in verifying and state.add_plain_token(seq, token_id)):
                    seq.add_sampled(token_id)
                    out.add_token(state, token_id)
                    out.generated_tokens += 1
                    continue
                deltas = self._update_entry(state, ScheduledSeq(batch, b), results[b], verifying.get(b), out)
                if done is None:
                    produced[state.request_id] = (state, deltas, None)
                else:
                    done[1].extend(deltas)
            except Exception as exc:  # noqa: BLE001 - a bug in one request's output fails that request only
                produced[state.request_id] = (state, done[1] if done is not None else [], exc)
        return list(produced.values())

    def _accept_drafts(self, entry: ScheduledSeq, verdict: Verdict) -> None:
        """Verified KV is the fed token's and the accepted drafts'; the rows past them are discarded."""
        seq, accepted = entry.seq, verdict.num_accepted
        entry.num_new_tokens = 1 + accepted
        seq.token_ids.extend(verdict.token_ids[:accepted])  # before `advance` hashes the blocks they fill
        self.block_manager.trim(seq, seq.num_computed_tokens + entry.num_new_tokens)

    def _update_entry(self, state: RequestState, entry: ScheduledSeq, result: StepResult, verdict: Verdict | None,
                      out: StepOutput) -> list[OutputDelta]:
        seq = entry.seq
        if entry.cached_tokens is not None:
            out.cached_tokens += entry.cached_tokens
            if seq.num_preemptions == 0:
                state.num_cached_tokens = entry.cached_tokens
                out.prompt_tokens += seq.num_prompt_tokens
        if entry.is_prefill:
            out.prefill_tokens += entry.num_new_tokens
        if result.all_logits is not None:
            state.add_prompt_logits(seq.num_computed_tokens - entry.num_new_tokens, result.all_logits)
            seq.needs_prompt_logits = state.needs_prompt_logits
        if not result.token_ids:
            return []
        if verdict is not None:
            return self._add_verified(state, seq, result, verdict, out)
        if state.beam is not None:  # the beams advance together once all of them reported
            beam = state.beam
            round_ = beam.advance(seq, result.sample_logits)
            if round_ is not None:
                seqs = self.grow_beams(round_.parents, round_.tokens, beam.sequences)
                beam.grown(round_, seqs)
                out.generated_tokens += len(seqs)
            state.seqs = {s.seq_id: s for s in beam.sequences}
            return beam.final_deltas() if beam.done else []
        seqs = [seq]
        if seq.num_samples > 1:  # the prompt is done: fork into n samples sharing its blocks
            seqs += [self.fork(seq, i) for i in range(1, seq.num_samples)]
            seq.num_samples = 1
            state.seqs.update((s.index, s) for s in seqs)
        deltas = []
        for s, token_id, logprob, top in zip(seqs, result.token_ids, result.logprobs, result.top):
            s.add_sampled(token_id)
            out.generated_tokens += 1
            deltas.append(state.add_token(s.index, token_id, logprob, top, result.sample_logits, s.num_tokens))
            if state.samples[s.index].finish_reason is not None:
                self.finish(s)
                state.seqs.pop(s.index, None)
        return deltas

    def _add_verified(self, state: RequestState, seq: Sequence, result: StepResult, verdict: Verdict,
                      out: StepOutput) -> list[OutputDelta]:
        """A verified entry's tokens (its accepted drafts, already in the sequence, then the target's next token), in
        order through the request's stop rules: a stop ends the sequence there, the tokens after it are dropped."""
        base = seq.num_tokens - verdict.num_accepted
        deltas = []
        for i, (token_id, logprob, top) in enumerate(zip(result.token_ids, result.logprobs, result.top)):
            deltas.append(state.add_token(seq.index, token_id, logprob, top, None, base + i + 1))
            out.generated_tokens += 1
            if state.samples[seq.index].finish_reason is not None:
                self.finish(seq)
                state.seqs.pop(seq.index, None)
                return deltas
        seq.append_token(result.token_ids[-1])
        return deltas

    def grow_beams(self, parents: list[Sequence], tokens: list[int], beams: list[Sequence]) -> list[Sequence]:
        """Carry out a beam-search round: continuation i grows from `parents[i]` with `tokens[i]`. A parent's first
        continuation reuses its sequence, further ones fork it; the `beams` without one are freed. Returns each
        continuation's sequence, in order."""
        used: set[int] = set()
        seqs = []
        for source in parents:  # all forks before any token is appended
            source.beam_width = 1
            if source.seq_id not in used:
                used.add(source.seq_id)
                seqs.append(source)
            elif source.status is SequenceStatus.RUNNING:
                seqs.append(self.fork(source, 0))
            else:  # a preempted parent holds no blocks: its copy recomputes from scratch, like it will
                child = source.fork(0)
                self.add(child)
                seqs.append(child)
        for seq in beams:
            if seq.seq_id not in used:
                self.finish(seq)
        for seq, token in zip(seqs, tokens):
            seq.append_token(token)
        return seqs

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
        """Nothing could run: free the newest beam waiting for its siblings' logits (runtime/native/beam_search.py).

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
