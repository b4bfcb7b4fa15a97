"""Token bitmasks for a batch: fill one row per constrained sample, then mask the logits in one call.

Rows without a guide (or whose grammar already finished) stay untouched, bit for bit, so
unconstrained requests in the same batch sample exactly what they would alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import xgrammar as xgr

from runtime.guided.guide import GuideState


class Guide(Protocol):
    """What the sampler needs from a row's guide (GuideState, or a DraftPosition)."""

    @property
    def active(self) -> bool: ...

    def fill_bitmask(self, bitmask: torch.Tensor, index: int) -> None: ...


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """An int32 bitmask [rows, ceil(vocab/32)] with every token allowed."""
    return xgr.allocate_token_bitmask(rows, vocab_size)


def fill_bitmasks(guides: Sequence[Guide | None], vocab_size: int) -> tuple[torch.Tensor, list[int]] | None:
    """(bitmask [N, W], indices of the constrained rows), or None when no row is constrained."""
    indices = [i for i, g in enumerate(guides) if g is not None and g.active]
    if not indices:
        return None
    bitmask = allocate_bitmask(len(guides), vocab_size)
    matchers, matcher_rows = [], []
    for i in indices:
        guide = guides[i]
        if isinstance(guide, GuideState):  # the common case: one batched call fills them all
            matchers.append(guide.matcher)
            matcher_rows.append(i)
        else:
            guide.fill_bitmask(bitmask, i)  # type: ignore[union-attr]
    if matchers:
        _batch_matcher().batch_fill_next_token_bitmask(matchers, bitmask, matcher_rows)
    return bitmask, indices


_BATCH: list[xgr.BatchGrammarMatcher] = []


def _batch_matcher() -> xgr.BatchGrammarMatcher:
    if not _BATCH:
        _BATCH.append(xgr.BatchGrammarMatcher(max_threads="auto"))
    return _BATCH[0]


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: list[int]) -> None:
    """Set disallowed tokens of rows `indices` to -inf, in place (float logits [N, V], any device)."""
    mask = bitmask.to(logits.device, non_blocking=True)
    xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=logits.shape[-1], indices=indices)
