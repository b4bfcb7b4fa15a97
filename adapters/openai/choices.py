"""Bookkeeping both OpenAI endpoints share while turning deltas into choices."""

from __future__ import annotations

from runtime.request import OutputDelta, TokenLogprob, Usage


class ChoiceTracker:
    """Maps (prompt_index, delta.index) to the choice index, remembers each prompt, sums usage.

    Choices are numbered prompt_index * n + sample_index, as OpenAI numbers them for list prompts.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.usage = Usage(prompt_tokens=0, completion_tokens=0)
        self.prompt_token_ids: dict[int, list[int]] = {}
        self.prompt_logprobs: dict[int, list[TokenLogprob | None]] = {}
        self._started: set[int] = set()
        self.finish_reasons: dict[int, str] = {}

    def see(self, prompt_index: int, delta: OutputDelta) -> tuple[int, bool]:
        """Record `delta`; return (choice index, whether this is the choice's first delta)."""
        if delta.prompt_token_ids is not None:
            self.prompt_token_ids[prompt_index] = list(delta.prompt_token_ids)
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs[prompt_index] = list(delta.prompt_logprobs)
        if delta.usage is not None:  # once per engine request, summed over its sequences
            self.usage.prompt_tokens += delta.usage.prompt_tokens
            self.usage.completion_tokens += delta.usage.completion_tokens
            self.usage.cached_tokens += delta.usage.cached_tokens
        choice = prompt_index * self.n + delta.index
        first = choice not in self._started
        self._started.add(choice)
        if delta.finish_reason is not None:
            self.finish_reasons[choice] = delta.finish_reason
        return choice, first
