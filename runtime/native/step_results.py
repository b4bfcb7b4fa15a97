"""StepResults: what one step produced for each of its inputs, kept as the step's columns.

A 256-row decode step samples one id per row. Made as one StepResult per row (and its lists of ids, logprobs and
top alternatives), the results were four objects per row per step; here the sampled ids stay one flat list, and a
row's token is read from `first_ids()`. A StepResult is made only for a row that is indexed (`results[b]`): rows
asking for logits or logprobs, speculative verification, beam search, tests. It is kept, so changes to it
(speculative verification rewrites a row's tokens) are seen by later readers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from runtime.native.row_view import RowView


@dataclass(slots=True)
class StepResult:
    """What the step produced for one StepInput (tensors are float32, on the CPU unless asked otherwise)."""

    token_ids: Sequence[int] = ()  # one per sample row
    logprobs: Sequence[float] = ()  # raw logprob of each chosen token (0.0: not asked)
    top: Sequence[list[tuple[int, float]]] = ()  # per row, best first
    all_logits: torch.Tensor | None = None  # [len(token_ids of the input), vocab]
    sample_logits: torch.Tensor | None = None  # [1, vocab]: the row every sample was drawn from
    # (on the runner's device instead when the input asked for logits_on_device)
    row_argmax: list[int] | None = None  # return_row_argmax: each new token's greedy id


class StepResults(RowView[StepResult]):
    """One step's results, one per input (see the module docstring)."""

    __slots__ = (
        "_all_logits",
        "_counts",
        "_first",
        "_ids",
        "_logprobs",
        "_made",
        "_row_argmax",
        "_sample_logits",
        "_top_ids",
        "_top_lps",
    )

    def __init__(self, counts: list[int], ids: list[int] | None = None, logprobs: list[float] | None = None,
                 top_ids: list[list[int]] | None = None, top_lps: list[list[float]] | None = None,
                 all_logits: dict[int, torch.Tensor] | None = None,
                 sample_logits: dict[int, torch.Tensor] | None = None,
                 row_argmax: dict[int, list[int]] | None = None) -> None:
        """`counts`: sample rows of each input; `ids`, `logprobs`, `top_*`: every sample row's, flat, in input order
        (None: nothing was sampled, or not asked); the dicts: per input, only those that have one."""
        self._counts = counts
        # each input's first sample row: the input's own index when every input drew exactly one (a decode step)
        self._first: Sequence[int] | None = (
            None if ids is None else range(len(counts)) if counts.count(1) == len(counts)
            else list(accumulate(counts, initial=0)))
        self._ids, self._logprobs, self._top_ids, self._top_lps = ids, logprobs, top_ids, top_lps
        self._all_logits, self._sample_logits = all_logits or {}, sample_logits or {}
        self._row_argmax = row_argmax or {}
        self._made: list[StepResult | None] = [None] * len(counts)

    def __len__(self) -> int:
        return len(self._counts)

    def first_ids(self) -> Sequence[int | None]:
        """Each input's first sampled id (None: it sampled none). In a decode step, where every input drew one id
        and no row was indexed, that is the step's id list itself."""
        if isinstance(self._first, range) and not any(self._made):
            return self._ids  # type: ignore[return-value]
        return [self._first_id(b) for b in range(len(self._counts))]

    def _first_id(self, b: int) -> int | None:
        made = self._made[b]
        if made is not None:
            return made.token_ids[0] if made.token_ids else None
        if self._first is None or not self._counts[b]:
            return None
        return self._ids[self._first[b]]  # type: ignore[index]

    def _row(self, b: int) -> StepResult:
        made = self._made[b]
        if made is None:
            made = self._made[b] = self._make(b)
        return made

    def _make(self, b: int) -> StepResult:
        res = StepResult(all_logits=self._all_logits.get(b), sample_logits=self._sample_logits.get(b),
                         row_argmax=self._row_argmax.get(b))
        k = self._counts[b]
        if self._first is None or not k:
            return res
        i = self._first[b]
        res.token_ids = self._ids[i : i + k]  # type: ignore[index]
        res.logprobs = self._logprobs[i : i + k] if self._logprobs is not None else [0.0] * k
        top_ids, top_lps = self._top_ids, self._top_lps
        res.top = ([list(zip(top_ids[j], top_lps[j])) for j in range(i, i + k)] if top_ids is not None and top_lps
                   else [[] for _ in range(k)])
        return res
