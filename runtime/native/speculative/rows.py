"""TargetRows: the target's sampling row of one speculating sequence, and its rows after draft tokens.

Row j of a verify step (j = 0..K) samples after the first j drafts, so its processors must see them
as output tokens (penalties, min_tokens). A row whose processors edit nothing (runtime.native.sampler
`edits_logits`, monotone in the output length) gives the same distribution whatever the output tokens
are: then the base row stands for every j and no copies are made.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from runtime.native.sampler import SamplingRow, edits_logits, plain_greedy


@dataclass
class TargetRows:
    base: SamplingRow  # the row before any draft token
    greedy: bool
    edits: bool  # processors change the logits: rows after drafts differ from `base`

    @classmethod
    def of(cls, base: SamplingRow) -> TargetRows:
        return cls(base, base.options.greedy, edits_logits(base))

    @property
    def plain_greedy(self) -> bool:
        """Greedy over the raw logits, no logprobs asked: verification needs only each row's argmax."""
        return plain_greedy([self.base])

    def after(self, drafts: list[int]) -> SamplingRow:
        """The row that samples the token following `drafts`."""
        if not self.edits or not drafts:
            return self.base
        return replace(self.base, output_token_ids=list(self.base.output_token_ids) + drafts)

    def verify_rows(self, drafts: list[int]) -> list[SamplingRow]:
        """The K+1 rows of a verify step over `drafts` (K)."""
        if not self.edits:
            return [self.base] * (len(drafts) + 1)
        return [self.after(drafts[:j]) for j in range(len(drafts) + 1)]
