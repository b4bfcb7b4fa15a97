"""Runtime logprobs (TokenLogprob) in each OpenAI API's own shape.

Completions (legacy): parallel lists `tokens` / `token_logprobs` / `top_logprobs` (dict token ->
logprob holding the top-k plus the sampled token, so up to k+1 entries, as OpenAI documents) /
`text_offset` (character offset into the choice's text). Chat: a list of
`{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}` with exactly the k requested.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from adapters.openai.responses import ChatTokenLogprob, CompletionLogprobs, TopLogprob
from runtime.request import TokenLogprob
from runtime.tokenizer import Tokenizer

# JSON has no -inf; OpenAI-compatible servers report impossible tokens as -9999.0.
_FLOOR = -9999.0


def finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else _FLOOR


class CompletionLogprobsBuilder:
    """Builds completions logprobs piece by piece, keeping the running text offset of one choice."""

    def __init__(self, tokenizer: Tokenizer, top_k: int) -> None:
        self._tok = tokenizer
        self._top_k = top_k
        self._offset = 0

    def piece(self, token_ids: Sequence[int], entries: Sequence[TokenLogprob | None]) -> CompletionLogprobs:
        """Logprobs for `token_ids`; an entry of None (a prompt's first token) has null logprobs."""
        out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for token_id, entry in zip(token_ids, entries, strict=True):
            text = self._tok.token_text(token_id)
            out.tokens.append(text)
            out.text_offset.append(self._offset)
            self._offset += len(text)
            if entry is None:
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(finite(entry.logprob))
            # Keyed by text, as OpenAI's legacy shape is: distinct ids may render alike (byte tokens
            # as '\ufffd'); the best-ranked one keeps the key, the alternatives come best first.
            top: dict[str, float] = {}
            for t, lp in entry.top[: self._top_k]:
                top.setdefault(self._tok.token_text(t), finite(lp))
            top.setdefault(text, finite(entry.logprob))
            out.top_logprobs.append(top)
        return out


def merge_completion_logprobs(parts: Sequence[CompletionLogprobs]) -> CompletionLogprobs:
    """Concatenate pieces (for the non-streamed response)."""
    out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    for p in parts:
        out.tokens += p.tokens
        out.token_logprobs += p.token_logprobs
        out.top_logprobs += p.top_logprobs
        out.text_offset += p.text_offset
    return out


def chat_logprobs(tokenizer: Tokenizer, top_k: int, token_ids: Sequence[int],
                  entries: Sequence[TokenLogprob]) -> list[ChatTokenLogprob]:
    """Chat logprobs entries for `token_ids` with `top_k` alternatives each."""
    out: list[ChatTokenLogprob] = []
    for token_id, entry in zip(token_ids, entries, strict=True):
        out.append(ChatTokenLogprob(
            token=tokenizer.token_text(token_id),
            logprob=finite(entry.logprob),
            bytes=tokenizer.token_bytes(token_id),
            top_logprobs=[TopLogprob(token=tokenizer.token_text(t), logprob=finite(lp),
                                     bytes=tokenizer.token_bytes(t)) for t, lp in entry.top[:top_k]],
        ))
    return out
