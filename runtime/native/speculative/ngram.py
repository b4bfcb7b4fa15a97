"""N-gram (prompt lookup) proposer: continue the text the way it continued the last time it appeared.

Finds the most recent earlier occurrence of the sequence's last n tokens (n from `max_n` down to
`min_n`) and proposes the tokens that followed it. No model, no KV cache; proposals are deterministic,
so verification treats them as one-hot draft distributions.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramProposer:
    """Prompt-lookup proposals of up to k tokens."""

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram sizes need 1 <= ngram_min <= ngram_max (got {min_n}, {max_n})")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier match of the longest suffix n-gram."""
        tokens = list(token_ids)
        total = len(tokens)
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            suffix = tokens[total - n :]
            # latest match first: recent context predicts the continuation best
            for start in range(total - n - 1, -1, -1):
                if tokens[start : start + n] == suffix:
                    follow = tokens[start + n : start + n + k]
                    if follow:
                        return follow
        return []
