"""GuideState: one sample's position in its grammar, advanced with each accepted token.

The sampler asks it for the allowed next tokens (`fill_bitmask`); the engine advances it after
sampling (`accept_tokens`). Speculative decoding verifies several positions in one step: use
`draft_positions(draft_ids)` for the per-position masks and `accept_tokens` for what was accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import xgrammar as xgr

class GuideState:
    """A per-sample xgrammar matcher (see the module docstring)."""

    def __init__(self, compiled: xgr.CompiledGrammar, stop_token_ids: Sequence[int], vocab_size: int) -> None:
        self.vocab_size = vocab_size
        # xgrammar keeps unlimited rollback history, which speculative verification relies on
        self._matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=list(stop_token_ids))
        self.failed = False  # a token the grammar rejected was forced in (should not happen): stop masking

    @property
    def matcher(self) -> xgr.GrammarMatcher:
        return self._matcher

    @property
    def active(self) -> bool:
        """True while the next token is constrained."""
        return not self.failed and not self._matcher.is_terminated()

    def fill_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        """Write the allowed-next-token bits into row `index` of an int32 bitmask [N, ceil(V/32)]."""
        self._matcher.fill_next_token_bitmask(bitmask, index)

    def accept_tokens(self, token_ids: Sequence[int]) -> int:
        """Advance over `token_ids` in order; returns how many the grammar accepted (stops at the first
        rejected one, which marks the guide failed). Tokens after termination count as accepted."""
        accepted = 0
        for token_id in token_ids:
            if self._matcher.is_terminated():
                accepted += 1
                continue
            if not self._matcher.accept_token(int(token_id)):
                self.failed = True
                break
            accepted += 1
        return accepted

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""
        if num_tokens > 0:
            self._matcher.rollback(num_tokens)

    def draft_positions(self, draft_ids: Sequence[int]) -> list[DraftPosition]:
        """Masks for verifying `draft_ids`: position k allows what may follow draft_ids[:k].

        Returns len(draft_ids) + 1 positions, fewer when the grammar rejects a draft token (the
        positions after it can never be accepted). The matcher state is unchanged afterwards.
        """
        masks = xgr.allocate_token_bitmask(len(draft_ids) + 1, self.vocab_size)
        accepted = 0
        for k in range(len(draft_ids) + 1):
            if self._matcher.is_terminated():
                masks[k].fill_(-1)  # finished: the engine stops the sample itself
            else:
                self._matcher.fill_next_token_bitmask(masks, k)
            if k == len(draft_ids) or self._matcher.is_terminated() or not self._matcher.accept_token(int(draft_ids[k])):
                break
            accepted += 1
        self.rollback(accepted)
        return [DraftPosition(masks, k) for k in range(min(accepted + 1, len(draft_ids) + 1))]


class DraftPosition:
    """A precomputed mask row standing in for a GuideState in a SamplingRow (speculative verification)."""

    active = True

    def __init__(self, masks: torch.Tensor, index: int) -> None:
        self._masks, self._index = masks, index

    def fill_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        bitmask[index].copy_(self._masks[self._index])
