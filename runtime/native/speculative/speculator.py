"""Speculator: speculative decoding inside in-flight batching, as proposals and verdicts.

Per step, around the target's forward pass (runtime/native/engine_core.py calls these in order):
  begin_step(batch)      whether the step may speculate (the limit, and the guard's measurements: guard.py;
                         decided before the step in flight is collected);
  plan(batch)            pick decode entries of requests that speculate, propose up to k tokens for each
                         (n-gram lookup or the draft model); returns the proposals, for which the scheduler
                         reserves KV slots;
  patch_inputs(inputs)   those entries feed [last token] + drafts and get logits for every row (left on
                         the device: verification copies back ids and logprobs, not [K+1, vocab] rows);
  verify(batch, results) accept a prefix of each proposal (runtime/native/speculative/verifier.py); the results then
                         hold the tokens to emit, and the verdicts go to `Scheduler.update_from_output`, which
                         lets the accepted drafts join the sequence, frees the slots of rejected ones and cuts
                         the emitted tokens at a stop.
Nothing here changes a target sequence or its blocks (the draft model keeps its own cache: draft.py).
Plain requests (num_draft_tokens 0, beams, guided decoding, generation logits) decode as usual in the same batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import torch

from runtime.native.block_manager import BlockManager
from runtime.native.request_state import RequestState
from runtime.native.sampler import compute_logprobs, processed_logits, processed_probs
from runtime.native.scheduled_batch import ScheduledBatch, ScheduledSeq
from runtime.native.sequence import Sequence
from runtime.native.speculative.draft import DraftJob, DraftProposer
from runtime.native.speculative.eagle import EagleProposer
from runtime.native.speculative.guard import SpeculationGuard
from runtime.native.speculative.ngram import NgramProposer
from runtime.native.speculative.rows import TargetRows
from runtime.native.speculative.verifier import Verdict, verify_greedy, verify_sampled
from runtime.native.step_inputs import StepInputs
from runtime.native.step_results import StepResult

MAX_DRAFT_TOKENS = 16  # per-request num_draft_tokens above this is clamped (the forward grows with it)

_Logprobs = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]  # compute_logprobs' result


@dataclass
class _Work:
    """One entry's speculation in the current step."""

    entry: ScheduledSeq
    state: RequestState
    target: TargetRows
    draft_token_ids: list[int]
    draft_probs: torch.Tensor | None  # on the CPU; None: deterministic proposals (n-gram) or a greedy target


@dataclass
class SpecCounters:
    draft_tokens: int = 0  # proposed
    accepted_tokens: int = 0
    steps: int = 0  # sequence-steps that verified a proposal


class Speculator:
    """Proposes, verifies and emits speculative tokens (see the module docstring)."""

    def __init__(self, proposer: NgramProposer | DraftProposer | EagleProposer, *, num_draft_tokens: int, block_manager: BlockManager,
                 max_num_tokens: int, context_window: int, seed: int, max_concurrency: int | None = None,
                 guard: SpeculationGuard | None = None) -> None:
        self.proposer = proposer
        self.num_draft_tokens = num_draft_tokens
        # speculation pays at low concurrency; above this many decoding sequences a step does not speculate
        self.max_concurrency = max_concurrency
        self.guard = guard  # None: speculate wherever the limit allows
        self._may_speculate = False  # this step's decision (begin_step)
        self.block_manager = block_manager
        self.max_num_tokens = max_num_tokens
        self.context_window = context_window
        self.generator = torch.Generator().manual_seed(seed)
        self.counters = SpecCounters()
        self._work: dict[int, _Work] = {}  # seq_id -> this step's speculation
        # seq_id -> (request id, CPU generator seeded as the request's generator on another device)
        self._cpu_twins: dict[int, tuple[str, torch.Generator]] = {}

    # ---- before the forward ---------------------------------------------------------------------
    def plan(self, batch: ScheduledBatch, requests: Mapping[str, RequestState]) -> list[tuple[Sequence, int]]:
        """Proposals for this step's speculating entries: (sequence, draft tokens), for which the scheduler must
        reserve KV slots (there is room: counted here) before the step's inputs are built."""
        self._work.clear()
        if isinstance(self.proposer, (DraftProposer, EagleProposer)):
            self.proposer.release_finished()
        if self._cpu_twins:
            self._cpu_twins = {k: v for k, v in self._cpu_twins.items() if v[0] in requests}
        if not self._may_speculate:
            return []
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
            return []
        targets = [TargetRows.of(s.sampling_rows(e.seq)[0]) for e, s, _ in wanted]
        if isinstance(self.proposer, DraftProposer):
            jobs = [DraftJob(e.seq, k, t, self._generator(s, e.seq)) for (e, s, k), t in zip(wanted, targets)]
            proposals = [(p.token_ids, p.probs) for p in self.proposer.propose(jobs)]
        elif isinstance(self.proposer, EagleProposer):
            proposals = [(self.proposer.propose(e.seq, k), None) for e, _, k in wanted]
        else:
            proposals = [(self.proposer.propose(e.seq.token_ids, k), None) for e, _, k in wanted]
        for (entry, state, _), target, (tokens, probs) in zip(wanted, targets, proposals):
            if tokens:
                self._work[entry.seq.seq_id] = _Work(entry, state, target, tokens, probs)
        return [(work.entry.seq, len(work.draft_token_ids)) for work in self._work.values()]

    def begin_step(self, batch: ScheduledBatch, requests: Mapping[str, RequestState]) -> bool:
        """Whether this step may speculate, decided once per step, before the engine collects the step in flight
        (proposing needs every token on the host): not above max_concurrency decoding sequences, one of them may
        draft, and the guard has not measured plain steps faster at this many sequences (runtime/native/speculative/guard.py).
        Else the step is a plain one, which the engine may launch ahead."""
        decoding = [e for e in batch.entries if not e.is_prefill]
        eligible = (self.max_concurrency is None or len(decoding) <= self.max_concurrency) and any(
            e.seq.request_id in requests and self._draft_len(e, requests[e.seq.request_id]) > 0 for e in decoding)
        if self.guard is not None:
            eligible = self.guard.begin_step(len(decoding), len(decoding) == len(batch.entries), eligible)
        self._may_speculate = eligible
        return eligible

    @property
    def proposed(self) -> bool:
        """Whether the planned step verifies drafts (the engine then waits for it before the next step)."""
        return bool(self._work)

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

    def patch_inputs(self, batch: ScheduledBatch, inputs: StepInputs) -> StepInputs:
        """The step's inputs where speculating entries score their drafts: every row's logits, kept on the device, no
        sampling (`inputs` itself when nothing was proposed)."""
        if not self.proposed:
            return inputs
        rows = list(inputs)
        for entry, inp in zip(batch.entries, rows):
            work = self._work.get(entry.seq.seq_id)
            if work is not None:
                inp.token_ids = inp.token_ids + work.draft_token_ids
                inp.sample_rows = []
                inp.return_all_logits = True
                inp.return_sample_logits = False
                inp.logits_on_device = True
                inp.return_row_argmax = work.target.plain_greedy
        return StepInputs.of(rows)

    def observe(self, batch: ScheduledBatch, inputs: StepInputs) -> None:
        """After the step's launch: an EAGLE head keeps the target's hidden states of every sequence."""
        if isinstance(self.proposer, EagleProposer):
            self.proposer.observe(batch.seqs, inputs)

    # ---- after the forward ----------------------------------------------------------------------
    def verify(self, batch: ScheduledBatch, results: Seq[StepResult]) -> dict[int, Verdict]:
        """The verdict of each verifying entry, by its index in `batch`; its result then holds the tokens to emit
        (accepted drafts and the target's next token) and their logprobs.

        Greedy targets that edit no logits and ask no logprobs compare the K+1 argmax ids the step brought back
        (StepResult.row_argmax: taken inside the decode graph, or once for the whole step), as plain greedy decoding
        does: per entry, an argmax and a log-softmax launched from the host made a step of 8 verifying sequences
        1 ms longer on the H200. For the others, device work for every entry is queued first and copied back with one
        wait: greedy targets need their K+1 argmax ids and those rows' logprobs; sampled ones their K+1 processed
        distributions (rejection sampling draws on the CPU), then the emitted tokens' logprobs."""
        verdicts: dict[int, Verdict] = {}
        checks: list[tuple[int, _Work, StepResult, torch.Tensor]] = []
        for b, (seq, result) in enumerate(zip(batch.seqs, results)):
            work = self._work.get(seq.seq_id)
            if work is None or result.all_logits is None:
                continue
            if result.row_argmax is not None:  # the step took these rows' argmax: nothing left on the device
                n = len(work.draft_token_ids) + 1
                verdicts[b] = self._accept(work, result, verify_greedy(result.row_argmax, work.draft_token_ids),
                                           (torch.zeros(n), None, None))
            else:
                checks.append((b, work, result, result.all_logits))
            result.all_logits = None
        if not checks:
            return verdicts
        first: list[torch.Tensor] = []  # per check: the K+1 argmax ids (greedy) or distributions (sampled)
        logprobs: list[_Logprobs | None] = []  # per check: of the argmax ids (greedy); sampled ones come later
        for _, work, _, logits in checks:
            rows = work.target
            if rows.greedy:
                edited = processed_logits(logits, rows.verify_rows(work.draft_token_ids)) if rows.edits else logits
                best = edited.argmax(dim=-1)  # what plain greedy decoding picks after each prefix of the drafts
                first.append(best)
                logprobs.append(compute_logprobs(logits, best, rows.base.options.logprobs or 0))
            else:
                first.append(processed_probs(logits, rows.verify_rows(work.draft_token_ids)))
                logprobs.append(None)
        first, logprobs = _to_host((first, logprobs))
        outcomes: list[Verdict] = []
        resampled: list[int] = []  # checks of sampled targets
        for c, (_, work, _, _) in enumerate(checks):
            if work.target.greedy:
                outcomes.append(verify_greedy(first[c].tolist(), work.draft_token_ids))
            else:
                outcomes.append(verify_sampled(first[c], work.draft_token_ids, work.draft_probs,
                                               self._generator(work.state, work.entry.seq)))
                resampled.append(c)
        if resampled:  # the logprobs of the tokens rejection sampling chose, again with one wait
            later = _to_host([compute_logprobs(checks[c][3][: len(outcomes[c].token_ids)],
                                               torch.tensor(outcomes[c].token_ids, device=checks[c][3].device),
                                               checks[c][1].target.base.options.logprobs or 0) for c in resampled])
            for c, lp in zip(resampled, later):
                logprobs[c] = lp
        for (b, work, result, _), verdict, lp in zip(checks, outcomes, logprobs):
            assert lp is not None
            verdicts[b] = self._accept(work, result, verdict, lp)
        return verdicts

    def _accept(self, work: _Work, result: StepResult, verdict: Verdict, logprobs: _Logprobs) -> Verdict:
        """Record the verdict's tokens and logprobs in `result`, and count it."""
        n = len(verdict.token_ids)
        chosen, top_ids, top_lps = logprobs
        result.token_ids = verdict.token_ids
        result.logprobs = chosen[:n].tolist()
        result.top = ([list(zip(i, lp)) for i, lp in zip(top_ids[:n].tolist(), top_lps[:n].tolist())]
                      if top_ids is not None and top_lps is not None else [[] for _ in range(n)])
        if self.guard is not None:
            self.guard.accepted(verdict.num_accepted)
        c = self.counters
        c.draft_tokens += len(work.draft_token_ids)
        c.accepted_tokens += verdict.num_accepted
        c.steps += 1
        return verdict

    # ---- helpers ----------------------------------------------------------------------------------
    def _generator(self, state: RequestState, seq: Sequence) -> torch.Generator:
        """The CPU generator of rejection sampling and draft draws: the request's own (seeded) one when it
        lives on the CPU, a CPU twin seeded alike when it lives on the GPU (seeded output stays
        reproducible), else the speculator's shared one."""
        gen = state.samples[seq.index].generator
        if gen is None:
            return self.generator
        if gen.device.type == "cpu":
            return gen
        twin = self._cpu_twins.get(seq.seq_id)
        if twin is None:
            twin = self._cpu_twins[seq.seq_id] = (seq.request_id, torch.Generator().manual_seed(gen.initial_seed()))
        return twin[1]


def _to_host(tree: Any) -> Any:
    """`tree` (tensors in nested lists and tuples) with every tensor copied to the CPU, after one wait for
    the device instead of one synchronising copy per tensor."""
    moved: list[torch.Tensor] = []

    def copy(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            moved.append(x)
            return x.to("cpu", non_blocking=True)
        if isinstance(x, (list, tuple)):
            return type(x)(copy(y) for y in x)
        return x

    out = copy(tree)
    device = next((t.device for t in moved if t.is_cuda), None)
    if device is not None:
        torch.cuda.current_stream(device).synchronize()
    return out
