"""Speculator: the engine's hook for speculative decoding inside in-flight batching.

Per step, around the target's forward pass (runtime/llm_engine.py calls these in order):
  plan(batch)            pick decode entries of requests that speculate, propose up to k tokens for
                         each (n-gram lookup or the draft model), reserve KV slots for them;
  patch_inputs(inputs)   those entries feed [last token] + drafts and get logits for every row;
  verify(batch, results) accept a prefix (runtime/speculative/verifier.py), let the accepted drafts
                         join the sequence, shrink the entry so only verified KV counts as computed, and
                         free the blocks that held only rejected tokens;
  emit(...)              one delta per emitted token, through the request's normal stop logic, so stop
                         ids / stop strings / max_tokens cut a multi-token step where they hit.
Plain requests (num_draft_tokens 0, beams, guided decoding, generation logits) decode as usual in
the same batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence as Seq
from dataclasses import dataclass, replace

import torch

from runtime.block_manager import BlockManager
from runtime.model_runner import StepInput, StepResult
from runtime.request import OutputDelta
from runtime.request_state import RequestState
from runtime.sampler import SamplingRow, compute_logprobs, processed_probs
from runtime.scheduler import ScheduledBatch, ScheduledSeq, Scheduler
from runtime.sequence import Sequence
from runtime.speculative.draft import DraftJob, DraftProposer
from runtime.speculative.ngram import NgramProposer
from runtime.speculative.verifier import verify

MAX_DRAFT_TOKENS = 16  # per-request num_draft_tokens above this is clamped (the forward grows with it)


@dataclass
class _Work:
    """One entry's speculation in the current step."""

    entry: ScheduledSeq
    state: RequestState
    draft_token_ids: list[int]
    draft_probs: torch.Tensor | None  # None: deterministic proposals (n-gram)
    num_accepted: int = 0


@dataclass
class SpecCounters:
    draft_tokens: int = 0  # proposed
    accepted_tokens: int = 0
    steps: int = 0  # sequence-steps that verified a proposal


class Speculator:
    """Proposes, verifies and emits speculative tokens (see the module docstring)."""

    def __init__(self, proposer: NgramProposer | DraftProposer, *, num_draft_tokens: int, block_manager: BlockManager,
                 max_num_tokens: int, context_window: int, seed: int) -> None:
        self.proposer = proposer
        self.num_draft_tokens = num_draft_tokens
        self.block_manager = block_manager
        self.max_num_tokens = max_num_tokens
        self.context_window = context_window
        self.generator = torch.Generator().manual_seed(seed)
        self.counters = SpecCounters()
        self._work: dict[int, _Work] = {}  # seq_id -> this step's speculation

    # ---- before the forward ---------------------------------------------------------------------
    def plan(self, batch: ScheduledBatch, requests: Mapping[str, RequestState]) -> None:
        self._work.clear()
        if isinstance(self.proposer, DraftProposer):
            self.proposer.release_finished()
        budget = self.max_num_tokens - batch.num_tokens
        free_blocks = self.block_manager.num_free_blocks  # minus what earlier entries reserve below
        wanted: list[tuple[ScheduledSeq, RequestState, int]] = []
        for entry in batch.entries:
            state = requests.get(entry.seq.request_id)
            k = self._draft_len(entry, state) if state is not None else 0
            k = min(k, budget)
            need = self.block_manager.blocks_needed(entry.seq, 1 + k) if k > 0 else 0
            if k > 0 and need <= free_blocks:
                wanted.append((entry, state, k))  # type: ignore[arg-type]
                budget -= k
                free_blocks -= need
        if not wanted:
            return
        if isinstance(self.proposer, DraftProposer):
            jobs = [DraftJob(e.seq, k, self._row_factory(s, e.seq), self._generator(s, e.seq)) for e, s, k in wanted]
            proposals = [(p.token_ids, p.probs) for p in self.proposer.propose(jobs)]
        else:
            proposals = [(self.proposer.propose(e.seq.token_ids, k), None) for e, _, k in wanted]
        for (entry, state, _), (tokens, probs) in zip(wanted, proposals):
            if not tokens:
                continue
            self.block_manager.append_slots(entry.seq, 1 + len(tokens))
            self._work[entry.seq.seq_id] = _Work(entry, state, tokens, probs)

    def _draft_len(self, entry: ScheduledSeq, state: RequestState) -> int:
        seq = entry.seq
        if entry.is_prefill or not entry.samples or entry.num_new_tokens != 1 or seq.num_samples > 1:
            return 0
        if state.beam is not None or state.request.guided is not None or state.options.return_generation_logits:
            return 0
        asked = state.request.num_draft_tokens
        k = self.num_draft_tokens if asked is None else min(asked, MAX_DRAFT_TOKENS)
        # the step emits up to k + 1 tokens: never past max_tokens or the context window
        room = min(seq.max_len, self.context_window) - seq.num_tokens - 1
        return max(0, min(k, room))

    def patch_inputs(self, batch: ScheduledBatch, inputs: Seq[StepInput]) -> None:
        """Speculating entries score their drafts: every row's logits, no sampling in the runner."""
        for entry, inp in zip(batch.entries, inputs):
            work = self._work.get(entry.seq.seq_id)
            if work is not None:
                inp.token_ids = inp.token_ids + work.draft_token_ids
                inp.sample_rows = []
                inp.return_all_logits = True
                inp.return_sample_logits = False

    # ---- after the forward ----------------------------------------------------------------------
    def verify(self, batch: ScheduledBatch, results: Seq[StepResult]) -> None:
        """Accept drafts; rejected tokens' KV is rolled back (before scheduler.advance counts it)."""
        for entry, result in zip(batch.entries, results):
            work = self._work.get(entry.seq.seq_id)
            if work is None or result.all_logits is None:
                continue
            seq, state = entry.seq, work.state
            drafts = work.draft_token_ids
            rows = [self._row_factory(state, seq)(drafts[:j]) for j in range(len(drafts) + 1)]
            target = processed_probs(result.all_logits, rows)
            verdict = verify(target, drafts, work.draft_probs, greedy=state.options.greedy,
                             generator=self._generator(state, seq))
            emitted = torch.tensor(verdict.token_ids)
            n = len(verdict.token_ids)
            chosen, top_ids, top_lps = compute_logprobs(result.all_logits[:n], emitted, state.options.logprobs or 0)
            result.all_logits = None
            result.token_ids = verdict.token_ids
            result.logprobs = chosen.tolist()
            result.top = ([list(zip(i, lp)) for i, lp in zip(top_ids.tolist(), top_lps.tolist())]
                          if top_ids is not None else [[] for _ in range(n)])
            work.num_accepted = verdict.num_accepted
            # verified KV: the fed token and the accepted drafts; the rest of the rows is discarded
            entry.num_new_tokens = 1 + verdict.num_accepted
            seq.token_ids.extend(drafts[: verdict.num_accepted])  # scheduler.advance hashes full blocks
            self.block_manager.trim(seq, seq.num_computed_tokens + entry.num_new_tokens)
            c = self.counters
            c.draft_tokens += len(drafts)
            c.accepted_tokens += verdict.num_accepted
            c.steps += 1

    def emit(self, state: RequestState, entry: ScheduledSeq, result: StepResult,
             scheduler: Scheduler) -> list[OutputDelta] | None:
        """Deltas of a speculating entry (None for plain entries): tokens in order, cut at a stop."""
        work = self._work.pop(entry.seq.seq_id, None)
        if work is None or work.num_accepted + 1 != len(result.token_ids):
            return None
        seq = entry.seq
        del seq.token_ids[seq.num_tokens - work.num_accepted :]  # re-appended one by one below
        deltas = []
        for token_id, logprob, top in zip(result.token_ids, result.logprobs, result.top):
            seq.append_token(token_id)
            deltas.append(state.add_token(seq, token_id, logprob, top, None))
            if state.samples[seq.index].finish_reason is not None:
                scheduler.finish(seq)  # tokens after the stop are dropped with the sequence's blocks
                state.seqs.pop(seq.index, None)
                break
        return deltas

    # ---- helpers ----------------------------------------------------------------------------------
    def _row_factory(self, state: RequestState, seq: Sequence):  # -> Callable[[list[int]], SamplingRow]
        base = state.sampling_rows(seq)[0]
        output = list(seq.output_token_ids)

        def make(extra: list[int]) -> SamplingRow:
            return replace(base, output_token_ids=output + list(extra))

        return make

    def _generator(self, state: RequestState, seq: Sequence) -> torch.Generator:
        gen = state.samples[seq.index].generator
        return gen if gen is not None and gen.device.type == "cpu" else self.generator
