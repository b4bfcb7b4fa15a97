"""EngineCore: the native engine's step, with no asyncio and no threads (vLLM v1's EngineCore, at nano-vllm's size).

    core.add_request(state)          # a validated request (RequestState), its grammar compiled
    core.abort(request_id[, index])  # the request, or one sample of it
    out = core.step()                # schedule -> launch/collect -> scheduler.update_from_output -> StepOutput

One driver calls these from one thread: the in-process engine's step thread (runtime/native/llm_engine.py), which the
engine-core process drives too (runtime/native/core_process.py). A step's output is token-level (ids, logprobs, finish
reasons: no text); the scheduler is the only code that changes sequences and blocks, and the model runner the only
one that touches tensors.

Async scheduling (on by default on CUDA): a step whose sequences need no host-side token knowledge
(`RequestState.overlappable`) is launched without waiting for it; its sampled tokens hold their places as
PENDING_TOKEN (`Scheduler.hold_places`) and feed the next step on the device. While the device runs step N, the core
schedules and launches step N+1, then collects step N's tokens: stop conditions are seen one step late, so a
finished sequence may compute one extra token, which is discarded. Any other step first collects the step in flight
(a synchronous step); so does one where speculation may propose drafts (its proposers read the tokens), which then
runs one ahead if nothing was proposed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from runtime.engine import EngineStats
from runtime.native.lora import LoraManager
from runtime.native.model_runner import ModelRunner, PendingStep
from runtime.request import OutputDelta
from runtime.native.request_state import RequestState
from runtime.native.scheduled_batch import ScheduledBatch
from runtime.native.scheduler import Scheduler
from runtime.native.sequence import PENDING_TOKEN
from runtime.native.speculative import Speculator, Verdict
from runtime.native.step_inputs import NO_SAMPLES, StepInputs
from runtime.native.step_output import StepOutput
from runtime.native.step_results import StepResults

logger = logging.getLogger(__name__)


class EngineCore:
    """Requests in, token-level step outputs out (see the module docstring)."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, lora: LoraManager, speculator: Speculator | None,
                 *, async_scheduling: bool) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.block_manager = scheduler.block_manager
        self.lora = lora
        self.speculator = speculator
        self.async_scheduling = async_scheduling
        self.requests: dict[str, RequestState] = {}
        self._with_deadline: dict[str, RequestState] = {}  # those of `requests` that have a deadline
        self._inflight: tuple[ScheduledBatch, PendingStep] | None = None  # launched, tokens not collected yet
        self._inflight_rows: dict[int, int] = {}  # seq_id -> its row in the in-flight step's sampled ids
        self._out = StepOutput()  # what the next step() returns (aborts before it land here too)
        self._last_batch = ScheduledBatch()
        self._totals = EngineStats()  # the counters that only grow (publish_stats copies them out)

    # ---- requests -----------------------------------------------------------------------------
    def add_request(self, state: RequestState) -> None:
        """Queue a request: for the scheduler, or in the LoRA manager until its adapter sits in a device slot."""
        self.requests[state.request_id] = state
        try:
            if state.request.deadline is not None:
                self._with_deadline[state.request_id] = state
            if state.adapter_key is None:
                self.scheduler.add(state.new_sequence())
            else:
                self.lora.enqueue(state.request_id)
        except Exception as exc:  # noqa: BLE001 - one request that cannot start fails alone
            self._fail_request(state, "could not start", exc)

    def abort(self, request_id: str, index: int | None = None) -> None:
        """End a request now ("abort"), or only its sample `index` (a stop string matched in the front end); unknown
        ids are ignored. The deltas come with the next step's output."""
        state = self.requests.get(request_id)
        if state is None:
            return
        if index is None or state.beam is not None:
            self._end(state, state.end_all("abort"))
            return
        seq = state.seqs.get(index) if 0 <= index < len(state.samples) else None
        if seq is None or seq.num_samples > 1:
            return  # ended already, or its samples have not forked yet (no text was made for it)
        delta = state.end_sample(index, "abort")
        if delta is None:
            return
        state.seqs.pop(index)
        self.scheduler.finish(seq)
        if state.finished:
            self._end(state, [delta])
        else:
            self._out.emit(state, [delta])

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self._inflight is not None or self.lora.has_admissible()

    # ---- the step -----------------------------------------------------------------------------
    def step(self) -> StepOutput:
        """One iteration: admit, expire, schedule, run, update. Returns what it produced (and what aborts before it
        produced)."""
        self._admit_adapters()
        self._expire_deadlines()
        batch = self.scheduler.schedule()
        if batch:
            self._totals.iterations += 1
            self._run(batch)
        else:
            self._collect_inflight()
        self._last_batch = batch
        out, self._out = self._out, StepOutput()
        out.num_scheduled = len(batch)
        t = self._totals
        t.generation_tokens_total += out.generated_tokens
        t.prompt_tokens_total += out.prompt_tokens
        t.prefill_tokens_computed += out.prefill_tokens
        t.prefix_cache_hit_tokens += out.cached_tokens
        return out

    def _admit_adapters(self) -> None:
        """Schedule requests whose LoRA adapter is now on the device; fail those whose load failed."""
        ready, failed = self.lora.admit()
        for request_id in ready:
            state = self.requests[request_id]
            try:
                self.scheduler.add(state.new_sequence())
            except Exception as exc:  # noqa: BLE001
                self._fail_request(state, "could not start", exc)
        for request_id, error in failed:
            state = self.requests[request_id]
            self._end(state, state.end_all("error", f"EngineFailedError: {error}"))

    def _expire_deadlines(self) -> None:
        now = time.monotonic()
        for state in list(self._with_deadline.values()):
            if now > state.request.deadline:  # type: ignore[operator]
                self._end(state, state.end_all("abort"))

    def _run(self, batch: ScheduledBatch) -> None:
        overlap = self._overlappable(batch)
        spec = self.speculator
        may_speculate = spec is not None and spec.begin_step(batch, self.requests)
        # proposing drafts needs every token on the host, as does a step that cannot run one ahead: finish the step
        # in flight first
        if not overlap or may_speculate:
            self._collect_inflight()
            batch.drop_finished()
            if not batch:
                return
        if spec is not None:
            for seq, num_drafts in spec.plan(batch, self.requests):  # runtime/native/speculative
                self.scheduler.reserve_slots(seq, 1 + num_drafts)
            # a step that verifies drafts ends on the host; one where nothing was proposed still runs one ahead
            overlap = overlap and not spec.proposed
        try:  # a step that cannot be built or launched fails its requests, not the engine
            inputs = self._step_inputs(batch)
            if spec is not None:
                inputs = spec.patch_inputs(batch, inputs)
            pending = self.runner.launch(inputs, batch.copies)
            if spec is not None:
                spec.observe(batch, inputs)
        except Exception as exc:  # noqa: BLE001 - one failed step fails its requests, not the engine
            self._fail_batch(batch, exc)
            return
        self._collect_inflight()  # step N's tokens, while the device runs step N+1 (no-op when synchronous)
        if overlap:
            self._inflight_rows = self.scheduler.hold_places(batch)
            self._inflight = (batch, pending)
            return
        try:
            results = pending.collect()
            verdicts = spec.verify(batch, results) if spec is not None and spec.proposed else None
        except Exception as exc:  # noqa: BLE001
            self._fail_batch(batch, exc)
            return
        self._update(batch, results, advanced=False, verdicts=verdicts)

    def _overlappable(self, batch: ScheduledBatch) -> bool:
        """Whether the step may run before the host knows the tokens of the step in flight (async scheduling)."""
        if not self.async_scheduling:
            return False
        requests = self.requests
        return all(not samples or (requests[seq.request_id].overlappable and seq.num_samples == 1)
                   for seq, samples in zip(batch.seqs, batch.samples))

    def _collect_inflight(self) -> None:
        """Wait for the step in flight and apply its tokens."""
        if self._inflight is None:
            return
        (batch, pending), self._inflight = self._inflight, None
        self._inflight_rows = {}
        try:
            results = pending.collect()
        except Exception as exc:  # noqa: BLE001
            self._fail_batch(batch, exc)
            return
        self._update(batch, results, advanced=True)

    def _update(self, batch: ScheduledBatch, results: StepResults, *, advanced: bool,
                verdicts: dict[int, Verdict] | None = None) -> None:
        """The scheduler applies the step; each request's deltas go out, the requests that finished end."""
        out = self._out
        produced = self.scheduler.update_from_output(batch, results, self.requests, out, advanced=advanced,
                                                     verdicts=verdicts)
        for state, deltas, error in produced:
            if error is not None:
                self._fail_request(state, "output processing failed", error, deltas)
            elif state.finished:
                self._end(state, deltas)
            else:
                out.emit(state, deltas)

    def _step_inputs(self, batch: ScheduledBatch) -> StepInputs:
        """The step's inputs, written column by column (runtime/native/step_inputs.py): no object per row."""
        inputs = StepInputs()
        add, requests, inflight_rows, lora = inputs.add, self.requests, self._inflight_rows, self.lora
        for b, (seq, num_new, samples) in enumerate(zip(batch.seqs, batch.num_new, batch.samples)):
            state = requests[seq.request_id]
            start = seq.num_computed_tokens
            token_ids = seq.token_ids
            add(token_ids, start, num_new, start, seq.block_table, seq.table_row,
                state.sampling_rows(seq) if samples else NO_SAMPLES,
                inflight_rows.get(seq.seq_id, -1) if token_ids[-1] == PENDING_TOKEN else -1,
                lora.slot_of(seq.request_id) if state.adapter_key is not None else -1)
            if state.wants_prompt_logits and state.needs_prompt_logits and start < seq.num_prompt_tokens:
                inputs.all_logits.add(b)
            # beam search ranks continuations by the raw next-token logits (runtime/native/beam_search.py)
            if samples and (state.options.return_generation_logits or state.beam is not None):
                inputs.sample_logits.add(b)
        return inputs

    # ---- ending requests ----------------------------------------------------------------------
    def _end(self, state: RequestState, deltas: list[OutputDelta]) -> None:
        """Emit the request's last deltas, then drop it and free its blocks."""
        for seq in list(state.seqs.values()):
            self.scheduler.finish(seq)
        state.seqs.clear()
        self.lora.finish(state.request_id)
        self._out.emit(state, deltas, final=True)
        self.requests.pop(state.request_id, None)
        self._with_deadline.pop(state.request_id, None)

    def _fail_batch(self, batch: ScheduledBatch, exc: Exception) -> None:
        logger.exception("model step failed", exc_info=exc)
        for request_id in dict.fromkeys(seq.request_id for seq in batch.seqs):
            state = self.requests.get(request_id)
            if state is not None:
                self._end(state, state.end_all("error", f"EngineFailedError: model step failed: {exc!r}"))

    def _fail_request(self, state: RequestState, what: str, exc: Exception,
                      deltas: list[OutputDelta] | None = None) -> None:
        """End one request with an error (after its `deltas`): what it brought broke a step for it alone."""
        logger.exception("%s for request %s", what, state.request_id, exc_info=exc)
        self._end(state, [*(deltas or []), *state.end_all("error", f"EngineFailedError: {what}: {exc!r}")])

    def fail_all(self, error: str, unadded: Iterable[RequestState] = ()) -> StepOutput:
        """End every request (and `unadded` ones, never handed to add_request) with `error`: the step loop died, so
        the scheduler may be inconsistent and no block is freed. Returns the output holding their last deltas."""
        for state in unadded:
            self.requests[state.request_id] = state
        for state in list(self.requests.values()):
            state.seqs.clear()
            self._end(state, state.end_all("error", error))
        out, self._out = self._out, StepOutput()
        return out

    # ---- stats --------------------------------------------------------------------------------
    def publish_stats(self, st: EngineStats) -> None:
        """Write the state after the last step into `st` (the driver's snapshot, under its lock)."""
        # requests with a running sequence; else with a preempted one; else waiting (from the scheduler's queues: a
        # look at every request's sequences took 3% of a 256-row step's host time, H200)
        scheduler, batch = self.scheduler, self._last_batch
        running_ids = {s.request_id for s in scheduler.running}
        paused_ids = {s.request_id for s in scheduler.waiting if s.num_preemptions} - running_ids
        running, paused = len(running_ids), len(paused_ids)
        prefill = [(seq.request_id, n) for seq, n, p in zip(batch.seqs, batch.num_new, batch.prefill) if p]
        t = self._totals
        st.iterations, st.generation_tokens_total = t.iterations, t.generation_tokens_total
        st.prompt_tokens_total, st.prefill_tokens_computed = t.prompt_tokens_total, t.prefill_tokens_computed
        st.prefix_cache_hit_tokens = t.prefix_cache_hit_tokens
        st.waiting, st.running, st.paused = len(self.requests) - running - paused, running, paused
        st.scheduled = len({seq.request_id for seq in batch.seqs})
        st.context_requests = len({request_id for request_id, _ in prefill})
        st.generation_requests = len({seq.request_id for seq, p in zip(batch.seqs, batch.prefill) if not p})
        st.context_tokens = sum(n for _, n in prefill)
        st.kv_blocks_used, st.kv_blocks_free = self.block_manager.num_used_blocks, self.block_manager.num_free_blocks
        st.preemptions = scheduler.num_preemptions
        st.eager_iterations = self.runner.eager_steps
        for name, value in self.lora.stats().items():
            setattr(st, name, value)
        if self.speculator is not None:
            c = self.speculator.counters
            st.spec_draft_tokens, st.spec_accepted_tokens, st.spec_steps = c.draft_tokens, c.accepted_tokens, c.steps
