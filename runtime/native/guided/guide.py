"""GuideState: one sample's position in its grammar, advanced with each accepted token.

The sampler masks the sample's next token with its matcher (runtime/native/guided/bitmask.py fills the masks
of a whole batch in one call); the engine advances it after sampling (`accept_tokens`). Speculative
decoding is off for guided requests (runtime/native/speculative/speculator.py), so one token per step.
Once `complete`, the request state finishes the sample ("stop"), whatever ignore_eos or min_tokens say:
past its end the matcher no longer masks, so the model would go on unconstrained.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (imported where a guide is made: see runtime/native/guided/__init__.py)
    import xgrammar as xgr


class GuideState:
    """A per-sample xgrammar matcher (see the module docstring)."""

    def __init__(self, compiled: xgr.CompiledGrammar, stop_token_ids: Sequence[int]) -> None:
        import xgrammar as xgr

        self._matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=list(stop_token_ids))
        self.failed = False  # a token the grammar rejected was forced in (should not happen): stop masking

    @property
    def matcher(self) -> xgr.GrammarMatcher:
        return self._matcher

    @property
    def active(self) -> bool:
        """True while the next token is constrained."""
        return not self.failed and not self._matcher.is_terminated()

    @property
    def complete(self) -> bool:
        """True once the grammar accepted its end (a stop token): the answer is whole and must end here."""
        return not self.failed and self._matcher.is_terminated()

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
