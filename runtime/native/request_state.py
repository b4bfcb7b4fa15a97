"""RequestState: the token-level output side of one request in the native engine core.

Turns sampled tokens into OutputDelta objects without text (the front end's OutputProcessor makes it:
runtime/output_processor.py): stop conditions on ids (stop token ids, eos, max_tokens, context window, a
grammar's end), logprobs, prompt logprobs, context/generation logits and usage. One SampleState per sample index.

Stop rules (vLLM's, which OpenAI clients expect), token side:
- a stop token id or eos ends the sample; the id is in `token_ids` and counted in usage; stop_reason is the
  id (None for eos); ignore_eos disables eos only;
- no stop condition applies before `min_tokens` tokens were generated;
- a guided sample ends ("stop", stop_reason None) when its grammar accepts its end token, whatever
  ignore_eos and min_tokens say: the grammar has no more to constrain;
- otherwise "length" at max_tokens or when the sequence fills the context window.
Stop strings are matched on text, in the front end, which then ends the sample here (`end_sample`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from runtime.native.beam_search import BeamSearch
from runtime.native.guided.guide import GuideState
from runtime.request import (
    FinishReason,
    GenerationRequest,
    OutputDelta,
    TokenLogprob,
    Usage,
)
from runtime.native.sampler import SamplingRow, compute_logprobs, make_generator
from runtime.native.sequence import OutputTokens, Sequence
from runtime.validation import PreparedRequest


@dataclass
class SampleState:
    """Stop state and bookkeeping of one sample."""

    generator: torch.Generator | None
    num_tokens: int = 0
    cumulative_logprob: float = 0.0
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    generation_logits: list[torch.Tensor] = field(default_factory=list)
    guide: GuideState | None = None  # grammar-constrained decoding: the sample's matcher


class RequestState:
    """Everything the engine keeps for one request besides its sequences' tokens and blocks."""

    def __init__(
        self,
        request: GenerationRequest,
        prepared: PreparedRequest,
        *,
        eos_token_ids: list[int],
        context_window: int,
        device: torch.device,
        loop: asyncio.AbstractEventLoop | None = None,
        queue: asyncio.Queue[Any] | None = None,
        new_guide: Callable[[], GuideState] | None = None,
    ) -> None:
        self.request = request
        self.request_id = request.request_id
        self.options = request.sampling
        self.prompt_token_ids = prepared.prompt_token_ids
        self.max_tokens = prepared.max_tokens
        self.bad_words_ids = prepared.bad_words_ids
        self.eos_token_ids = eos_token_ids
        self.context_window = context_window
        self.loop, self.queue = loop, queue
        opts = self.options
        self.samples = [
            SampleState(
                generator=make_generator(opts.seed, i, device),
                guide=new_guide() if new_guide is not None else None,
            )
            for i in range(opts.n)
        ]
        self.seqs: dict[int, Sequence] = {}  # live sequences by sample index (by seq_id for beams)
        self._rows: dict[int, list[SamplingRow]] = {}  # sampling rows by seq_id (sampling_rows)
        self.beam = None if opts.beam_width == 1 else BeamSearch(
            self.request_id, opts, max_tokens=self.max_tokens, context_window=context_window,
            eos_token_ids=eos_token_ids,
        )
        self.wants_prompt_logits = opts.prompt_logprobs is not None or opts.return_context_logits
        # one sample, no grammar, no logits returned: what both flags below start from
        single_plain = (new_guide is None and self.beam is None and opts.n == 1 and not self.wants_prompt_logits
                        and not opts.return_generation_logits)
        # Whether a step may sample this request's next token before the host knows its last one (the
        # engine's async scheduling): not with grammars, token-dependent processors, beams, forks or logits.
        self.overlappable = (
            single_plain and not self.bad_words_ids and opts.repetition_penalty == 1.0
            and opts.presence_penalty == 0.0 and opts.frequency_penalty == 0.0
        )
        # A request whose tokens need no more than their ids (one sample, no logprobs, logits or grammar):
        # `add_plain_token` takes its tokens that cannot end it, and they travel as ids, not as deltas (StepOutput).
        self.token_only = single_plain and opts.logprobs is None
        # ids that may end a sample (min_tokens and ignore_eos aside): `add_plain_token` leaves them to add_token
        self._ending_ids = frozenset(opts.stop_token_ids) | frozenset(eos_token_ids)
        self.num_cached_tokens = 0
        self.adapter_key: str | None = None  # LoRA identity (set by the engine): the prefix-cache salt
        self.prompt_logprobs: list[TokenLogprob | None] = [None]  # the first prompt token has none
        self.context_logits: list[torch.Tensor] = []
        self.num_prompt_positions = 0  # prompt positions whose logits were recorded
        self._sent_first = False
        self._open_samples = len(self.samples)  # samples without a finish reason (`finished`, read every step)

    @property
    def finished(self) -> bool:
        return self._open_samples == 0 or (self.beam is not None and self.beam.done)

    @property
    def needs_prompt_logits(self) -> bool:
        """True until the logits of every prompt position were recorded (once, not on recompute)."""
        return self.wants_prompt_logits and self.num_prompt_positions < len(self.prompt_token_ids)

    def new_sequence(self) -> Sequence:
        opts = self.options
        seq = Sequence(
            self.request_id,
            self.prompt_token_ids,
            self.max_tokens,
            num_samples=opts.n,
            beam_width=opts.beam_width,
            cache_salt=self.adapter_key,
            needs_prompt_logits=self.wants_prompt_logits,
        )
        self.seqs[0] = seq
        if self.beam is not None:
            self.beam.start(seq)
        return seq

    def sampling_rows(self, seq: Sequence) -> list[SamplingRow]:
        """One row per sample drawn from `seq`'s next-token logits (n of them before the fork)."""
        rows = self._rows.get(seq.seq_id)
        if rows is not None and seq.num_samples == 1:
            return rows  # a row's fields never change, and its output ids are a live view
        indices = range(seq.num_samples) if seq.num_samples > 1 else (seq.index,)
        rows = [
            SamplingRow(
                options=self.options,
                prompt_token_ids=self.prompt_token_ids,
                output_token_ids=OutputTokens(seq),
                generator=self.samples[i].generator,
                eos_token_ids=self.eos_token_ids,
                bad_words_ids=self.bad_words_ids,
                guide=self.samples[i].guide,
            )
            for i in indices
        ]
        if seq.num_samples == 1:
            self._rows[seq.seq_id] = rows
        return rows

    # ---- prompt side --------------------------------------------------------------------------
    def add_prompt_logits(self, start_pos: int, logits: torch.Tensor) -> None:
        """Record logits [q, vocab] of positions start_pos.. (only prompt positions not seen yet)."""
        prompt = self.prompt_token_ids
        first = max(start_pos, self.num_prompt_positions)
        last = min(start_pos + logits.shape[0], len(prompt))
        if first >= last:
            return
        rows = logits[first - start_pos : last - start_pos]
        if self.options.return_context_logits:
            self.context_logits.append(rows.clone())
        k = self.options.prompt_logprobs
        if k is not None:
            # row p predicts prompt token p + 1; the last prompt position predicts the first output
            n = min(last, len(prompt) - 1) - first
            if n > 0:
                targets = torch.tensor(prompt[first + 1 : first + 1 + n])
                chosen, top_ids, top_lps = compute_logprobs(rows[:n], targets, k)
                for j in range(n):
                    top = list(zip(top_ids[j].tolist(), top_lps[j].tolist())) if top_ids is not None else []
                    self.prompt_logprobs.append(TokenLogprob(int(targets[j]), float(chosen[j]), top))
        self.num_prompt_positions = last

    # ---- output side --------------------------------------------------------------------------
    def add_token(
        self,
        index: int,
        token_id: int,
        logprob: float,
        top: list[tuple[int, float]],
        sample_logits: torch.Tensor | None,
        num_tokens: int,
    ) -> OutputDelta:
        """Sample `index` produced `token_id`, which makes its sequence `num_tokens` long: its delta, finished or
        not (whether it finished is recorded here; the scheduler then frees the sequence)."""
        opts = self.options
        s = self.samples[index]
        s.num_tokens += 1
        s.cumulative_logprob += logprob
        if s.guide is not None:
            s.guide.accept_tokens([token_id])
        delta = OutputDelta(request_id=self.request_id, index=index, token_ids=[token_id])
        if opts.logprobs is not None:
            delta.logprobs = [TokenLogprob(token_id, logprob, top[: opts.logprobs])]
        if opts.return_generation_logits and sample_logits is not None:
            s.generation_logits.append(sample_logits[0])

        may_stop = s.num_tokens >= opts.min_tokens
        if may_stop and token_id in opts.stop_token_ids:
            self._finish(s, "stop", token_id)
        elif (s.guide is not None and s.guide.complete) or (
                may_stop and not opts.ignore_eos and token_id in self.eos_token_ids):
            self._finish(s, "stop", None)
        if s.finish_reason is None and (s.num_tokens >= self.max_tokens or num_tokens >= self.context_window):
            self._finish(s, "length", None)
        if s.finish_reason is not None:
            self._close_sample(s, delta)
        delta.cumulative_logprob = self._cumulative(s)
        return delta

    def add_plain_token(self, seq: Sequence, token_id: int) -> bool:
        """`add_token`'s fast lane for a `token_only` request: counts `token_id` and returns True when it needs no
        delta (not the request's first token, and it cannot end the sample); False, counting nothing, otherwise:
        the caller then calls add_token. `seq` is not extended yet."""
        s = self.samples[0]
        if (not self._sent_first or token_id in self._ending_ids or s.num_tokens + 1 >= self.max_tokens
                or seq.num_tokens + 1 >= self.context_window):
            return False
        s.num_tokens += 1
        return True

    def end_all(self, reason: FinishReason, error: str | None = None) -> list[OutputDelta]:
        """Final deltas for every unfinished sample (abort, deadline, failure)."""
        return [delta for index in range(len(self.samples)) if (delta := self.end_sample(index, reason, error))]

    def end_sample(self, index: int, reason: FinishReason, error: str | None = None) -> OutputDelta | None:
        """The final delta of sample `index` ended from outside (a stop string matched in the front end, an abort);
        None when it had ended already."""
        s = self.samples[index]
        if s.finish_reason is not None:
            return None
        delta = OutputDelta(request_id=self.request_id, index=index, error=error)
        self._finish(s, reason, None)
        if reason != "error":
            self._close_sample(s, delta)
        else:
            delta.finish_reason = reason
        delta.cumulative_logprob = self._cumulative(s)
        return delta

    def _cumulative(self, s: SampleState) -> float | None:
        """The sample's summed logprob, known only when the request asked for logprobs (else not computed)."""
        return s.cumulative_logprob if self.options.logprobs is not None else None

    def decorate(self, deltas: list[OutputDelta]) -> None:
        """Prompt facts on the request's first delta; usage and context logits on its last."""
        if not deltas:
            return
        if not self._sent_first:
            first = deltas[0]
            first.prompt_token_ids = list(self.prompt_token_ids)
            if self.options.prompt_logprobs is not None:
                first.prompt_logprobs = self.prompt_logprobs
            self._sent_first = True
        if self.finished:
            last = deltas[-1]
            last.usage = self.usage()
            if self.options.return_context_logits and self.context_logits:
                last.context_logits = torch.cat(self.context_logits).float().cpu().numpy()

    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=len(self.prompt_token_ids),
            completion_tokens=self.beam.completion_tokens if self.beam else sum(s.num_tokens for s in self.samples),
            cached_tokens=self.num_cached_tokens,
        )

    def _finish(self, s: SampleState, reason: FinishReason, stop_reason: str | int | None) -> None:
        if s.finish_reason is None:
            self._open_samples -= 1
        s.finish_reason, s.stop_reason = reason, stop_reason

    def _close_sample(self, s: SampleState, delta: OutputDelta) -> None:
        """Mark `delta` as the sample's last."""
        delta.finish_reason, delta.stop_reason = s.finish_reason, s.stop_reason
        if self.options.return_generation_logits and s.generation_logits:
            delta.generation_logits = torch.stack(s.generation_logits).float().cpu().numpy()
