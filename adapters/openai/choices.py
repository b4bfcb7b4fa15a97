"""Bookkeeping both OpenAI endpoints share while turning deltas into choices."""

from __future__ import annotations

import time
from typing import Any, ClassVar

from adapters.openai.requests import SamplingFields
from adapters.openai.responses import ChatCompletion, ChatCompletionChunk, Completion, UsageInfo, running_usage
from runtime.request import OutputDelta, TokenLogprob, Usage
from runtime.tokenizer import Tokenizer

# the objects that carry id, created, model, choices and usage
_Body = ChatCompletion | ChatCompletionChunk | Completion


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
        self.generated = 0  # tokens delivered so far, all choices (continuous usage stats)

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
        self.generated += len(delta.token_ids)
        choice = prompt_index * self.n + delta.index
        first = choice not in self._started
        self._started.add(choice)
        if delta.finish_reason is not None:
            self.finish_reasons[choice] = delta.finish_reason
        return choice, first


class EndpointOutput:
    """What ChatOutput and CompletionOutput share: the response's id, model and creation time, the
    choice tracker, each choice's text so far, and the closing usage chunk."""

    # the endpoint's stream-chunk object, for the closing usage chunk
    _chunk_type: ClassVar[type[_Body]]

    def __init__(self, req: SamplingFields, response_id: str, model: str, tokenizer: Tokenizer,
                 created: int | None = None) -> None:
        self.req = req
        self.id = response_id
        self.model = model
        self.created = int(time.time()) if created is None else created
        self._tok = tokenizer
        self._tracker = ChoiceTracker(req.n)
        self._text: dict[int, list[str]] = {}

    def _running_usage(self, not_yet: int = 0) -> dict[str, int] | None:
        """With stream_options.continuous_usage_stats: the usage so far for a chunk, less `not_yet`
        generated tokens (a role chunk goes out before its delta's tokens); else None."""
        if not self.req.continuous_usage:
            return None
        t = self._tracker
        return running_usage(sum(map(len, t.prompt_token_ids.values())), t.generated - not_yet)

    def final_chunks(self) -> list[dict[str, Any]]:
        """With stream_options.include_usage: one last chunk with no choices and the usage."""
        if not self.req.include_usage:
            return []
        return [self._with_usage(self._chunk_type, [])]

    def _with_usage(self, cls: type[_Body], choices: list[Any]) -> dict[str, Any]:
        """A response or chunk object of this response with `choices` and the usage so far, as JSON."""
        return cls(id=self.id, created=self.created, model=self.model, choices=choices,
                   usage=UsageInfo.of(self._tracker.usage)).model_dump()
