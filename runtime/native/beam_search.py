"""Beam search on the native runtime (Triton's `beam_width`, vLLM's `use_beam_search`).

Semantics follow transformers' `generate(num_beams=W, do_sample=False)` (early_stopping=False), so the
same checkpoint gives the same beams:
- Beams are ranked by the sum of the raw log-softmax of their tokens (sampling knobs such as
  temperature, top_k/top_p and seed do not apply; min_tokens masks the stop tokens).
- Each round takes the best K = max(2, 1 + #stop tokens) * W continuations of all live beams. Of these,
  the ones among the best W that end (a stop token: eos unless ignore_eos, or stop_token_ids; or
  max_tokens / the context window reached) become finished hypotheses scored
  sum_logprobs / generated_len ** length_penalty; the best W continuations that do not end live on.
- The search stops when every continuation ended, or when W hypotheses are finished and the best live
  beam, scored at its current length, cannot beat the worst of them.
- The result is the W best hypotheses, best first, as OutputDelta indices 0..W-1, all at the end (beams
  are reordered every round, so nothing can be streamed before the search is over).

Each live beam is one Sequence. A round needs the next-token logits of every live beam; a beam whose
logits arrived waits (it has no uncomputed token, so the scheduler skips it) until its siblings report,
even across steps and preemptions. A round's decision (`BeamRound`: which parent each continuation grows from,
with which token) is carried out by the scheduler (`Scheduler.grow_beams`): the first continuation of a parent
reuses its sequence, further ones fork it (blocks shared, copy-on-write), and parents without continuations are
freed. This module changes no sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from runtime.request import OutputDelta, SamplingOptions, TokenLogprob
from runtime.native.sequence import Sequence


@dataclass
class Beam:
    """A live beam: its sequence, summed raw logprob and per-token logprobs."""

    seq: Sequence
    score: torch.Tensor  # float32 scalar, as transformers accumulates
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass
class Hypothesis:
    """A finished beam."""

    token_ids: list[int]
    score: float  # length-penalised
    cumulative_logprob: float
    logprobs: list[TokenLogprob]
    stopped_by: int | None  # the stop token id that ended it; None: length


@dataclass
class BeamRound:
    """A round's live continuations, best first: the sequence each grows from and its token, score and logprob."""

    parents: list[Sequence]
    tokens: list[int]
    scores: list[torch.Tensor]
    logprobs: list[list[TokenLogprob]]  # each continuation's logprobs so far


class BeamSearch:
    """The beam state of one request (see the module docstring)."""

    def __init__(
        self,
        request_id: str,
        options: SamplingOptions,
        *,
        max_tokens: int,
        context_window: int,
        eos_token_ids: list[int],
    ) -> None:
        self.request_id = request_id
        self.options = options
        self.width = options.beam_width
        self.max_tokens = max_tokens
        self.context_window = context_window
        eos = [] if options.ignore_eos else eos_token_ids
        self.stop_ids = list(dict.fromkeys([*eos, *options.stop_token_ids]))
        self.num_candidates = max(2, 1 + len(self.stop_ids)) * self.width
        self.beams: list[Beam] = []
        self.finished: list[Hypothesis] = []  # best first, at most `width`
        self.improvable = True
        self.done = False
        self._pending: dict[int, torch.Tensor] = {}  # seq_id -> next-token logits [vocab]

    def start(self, seq: Sequence) -> None:
        """The request's first sequence (it prefills the prompt once) is the only beam of round one."""
        self.beams = [Beam(seq, torch.zeros((), dtype=torch.float32))]

    @property
    def sequences(self) -> list[Sequence]:
        return [b.seq for b in self.beams]

    @property
    def completion_tokens(self) -> int:
        """Tokens of the returned beams (0 until the search is over)."""
        return sum(len(h.token_ids) for h in self.finished) if self.done else 0

    def advance(self, seq: Sequence, logits: torch.Tensor) -> BeamRound | None:
        """Record `seq`'s next-token logits [1, vocab]; once every live beam reported, decide the round.

        Returns the live continuations for the scheduler to grow (`grown` takes the sequences back); None while
        siblings are still computing, or when the search is over (`done`).
        """
        if self.done or all(b.seq is not seq for b in self.beams):
            return None
        self._pending[seq.seq_id] = logits.reshape(-1)
        if any(b.seq.seq_id not in self._pending for b in self.beams):
            return None  # siblings still computing
        return self._round()

    def grown(self, round_: BeamRound, seqs: list[Sequence]) -> None:
        """The scheduler grew `round_`'s continuations into `seqs` (one each, in order): the next round's beams."""
        self.beams = [Beam(seq, score, logprobs) for seq, score, logprobs in zip(seqs, round_.scores, round_.logprobs)]

    # ---- one round ----------------------------------------------------------------------------
    def _round(self) -> BeamRound | None:
        beams = self.beams
        raw = torch.log_softmax(torch.stack([self._pending.pop(b.seq.seq_id) for b in beams]).float(), dim=-1)
        vocab = raw.shape[-1]
        generated = beams[0].seq.num_output_tokens + 1  # length of every continuation
        logprobs = raw
        if generated <= self.options.min_tokens and self.stop_ids:
            logprobs = raw.clone()
            logprobs[:, self.stop_ids] = float("-inf")
        scores = torch.stack([b.score for b in beams])
        flat = (logprobs + scores[:, None]).reshape(-1)
        top_scores, top_index = flat.topk(min(self.num_candidates, flat.numel()))
        k_top = self.options.logprobs or 0
        tops = raw.topk(min(k_top, vocab), dim=-1) if k_top else None

        at_limit = generated >= self.max_tokens or beams[0].seq.num_tokens + 1 >= self.context_window
        try:
            penalty = float(generated) ** self.options.length_penalty
        except OverflowError:  # a huge length_penalty: every score is 0
            penalty = math.inf
        live: list[tuple[int, int, torch.Tensor]] = []  # (parent beam, token, score)
        ended: list[Hypothesis] = []
        for rank, (score, index) in enumerate(zip(top_scores, top_index.tolist())):
            parent, token = divmod(index, vocab)
            stops = token in self.stop_ids
            if at_limit or stops:
                if rank < self.width and self.improvable:
                    lp = self._token_logprob(raw, tops, parent, token)
                    ended.append(Hypothesis(
                        token_ids=beams[parent].seq.output_token_ids + [token],
                        score=float(score / penalty),
                        cumulative_logprob=sum(t.logprob for t in beams[parent].logprobs) + lp.logprob,
                        logprobs=beams[parent].logprobs + [lp],
                        stopped_by=token if stops else None,
                    ))
            elif len(live) < self.width:
                live.append((parent, token, score))
        self.finished = sorted(self.finished + ended, key=lambda h: -h.score)[: self.width]

        if live and len(self.finished) == self.width:
            best_possible = float(live[0][2] / penalty)
            self.improvable = self.improvable and best_possible > self.finished[-1].score
        if not live or not self.improvable:
            self.done = True  # the engine frees the remaining sequences when it ends the request
            return None
        return BeamRound(
            parents=[beams[parent].seq for parent, _, _ in live], tokens=[token for _, token, _ in live],
            scores=[score for _, _, score in live],
            logprobs=[beams[parent].logprobs + [self._token_logprob(raw, tops, parent, token)]
                      for parent, token, _ in live])

    def _token_logprob(self, raw: torch.Tensor, tops: torch.return_types.topk | None, parent: int,
                       token: int) -> TokenLogprob:
        top = list(zip(tops.indices[parent].tolist(), tops.values[parent].tolist())) if tops is not None else []
        return TokenLogprob(token, float(raw[parent, token]), top)

    # ---- output -------------------------------------------------------------------------------
    def final_deltas(self) -> list[OutputDelta]:
        """One delta per returned beam (index = rank, best first) with its whole output (its text is the front end's:
        a stop token's is not shown, as without beam search)."""
        opts = self.options
        return [OutputDelta(
            request_id=self.request_id,
            index=rank,
            token_ids=list(hyp.token_ids),
            logprobs=[TokenLogprob(t.token_id, t.logprob, t.top[: opts.logprobs]) for t in hyp.logprobs]
            if opts.logprobs is not None else None,
            finish_reason="stop" if hyp.stopped_by is not None else "length",
            stop_reason=hyp.stopped_by if hyp.stopped_by in opts.stop_token_ids else None,
            cumulative_logprob=hyp.cumulative_logprob,
        ) for rank, hyp in enumerate(self.finished)]
