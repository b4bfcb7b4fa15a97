"""Token bitmasks for a batch: fill the rows of all constrained samples in one call, mask the logits in another.

Rows without a guide (or whose grammar already finished) stay untouched, bit for bit, so
unconstrained requests in the same batch sample exactly what they would alone.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from runtime.native.device import to_device
from runtime.native.guided.guide import GuideState

if TYPE_CHECKING:  # (imported by the first constrained step: see runtime/native/guided/__init__.py)
    import xgrammar as xgr


def fill_bitmasks(guides: Sequence[GuideState | None], vocab_size: int) -> tuple[torch.Tensor, list[int]] | None:
    """(int32 bitmask [N, ceil(V/32)], indices of the constrained rows), or None when no row is constrained."""
    indices = [i for i, g in enumerate(guides) if g is not None and g.active]
    if not indices:
        return None
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(len(guides), vocab_size)
    _batch_matcher().batch_fill_next_token_bitmask([guides[i].matcher for i in indices],  # type: ignore[union-attr]
                                                   bitmask, indices)
    return bitmask, indices


@functools.cache
def _batch_matcher() -> xgr.BatchGrammarMatcher:
    """One for the process: it only holds a thread pool (half the cores; "auto")."""
    import xgrammar as xgr

    return xgr.BatchGrammarMatcher(max_threads="auto")


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: list[int]) -> None:
    """Set disallowed tokens of rows `indices` to -inf, in place (float logits [N, V], any device)."""
    import xgrammar as xgr

    mask = to_device(bitmask, logits.device)
    xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=logits.shape[-1], indices=indices)
