"""Deltas -> /v1/completions responses and stream chunks."""

from __future__ import annotations

import time
from typing import Any

from adapters.openai.choices import ChoiceTracker
from adapters.openai.logprobs import CompletionLogprobsBuilder, merge_completion_logprobs
from adapters.openai.requests import CompletionRequest
from adapters.openai.responses import Completion, CompletionChoice, CompletionLogprobs, UsageInfo
from runtime.request import OutputDelta
from runtime.tokenizer import Tokenizer


class CompletionOutput:
    """Turns `(prompt_index, delta)` items of one request into chunks (`chunks`) or one response (`add`,
    then `response`). Echo prepends the prompt (and its logprobs) to each choice's first text."""

    def __init__(self, req: CompletionRequest, response_id: str, model: str, tokenizer: Tokenizer,
                 created: int | None = None) -> None:
        self.req = req
        self.id = response_id
        self.model = model
        self.created = int(time.time()) if created is None else created
        self._tok = tokenizer
        self._prompts = req.prompts()
        self._tracker = ChoiceTracker(req.n)
        self._lp_builders: dict[int, CompletionLogprobsBuilder] = {}
        self._text: dict[int, list[str]] = {}
        self._logprobs: dict[int, list[CompletionLogprobs]] = {}

    def _piece(self, prompt_index: int, delta: OutputDelta) -> CompletionChoice:
        choice, first = self._tracker.see(prompt_index, delta)
        text = delta.text
        want_lp = self.req.logprobs is not None
        parts: list[CompletionLogprobs] = []
        builder = self._lp_builders.setdefault(choice, CompletionLogprobsBuilder(self._tok, self.req.logprobs or 0))
        if first and self.req.echo:
            prompt = self._prompts[prompt_index]
            prompt_ids = self._tracker.prompt_token_ids.get(prompt_index)
            if isinstance(prompt, str):
                text = prompt + text
            else:
                text = self._tok.decode(prompt, skip_special_tokens=False) + text
            prompt_lps = self._tracker.prompt_logprobs.get(prompt_index)
            if want_lp and prompt_ids is not None and prompt_lps is not None:
                parts.append(builder.piece(prompt_ids, prompt_lps))
        if want_lp and delta.logprobs is not None:
            parts.append(builder.piece(delta.token_ids, delta.logprobs))
        logprobs = merge_completion_logprobs(parts) if want_lp else None
        return CompletionChoice(index=choice, text=text, logprobs=logprobs, finish_reason=delta.finish_reason)

    # -- streaming --

    def chunks(self, item: tuple[int, OutputDelta]) -> list[dict[str, Any]]:
        """Zero or one chunk for one delta (nothing when it carries no text, logprobs or finish)."""
        piece = self._piece(*item)
        if not piece.text and piece.finish_reason is None and not (piece.logprobs and piece.logprobs.tokens):
            return []
        chunk = Completion(id=self.id, created=self.created, model=self.model, choices=[piece]).model_dump()
        if self.req.include_usage:
            chunk["usage"] = None  # OpenAI: every chunk has usage null when usage is requested
        return [chunk]

    def final_chunks(self) -> list[dict[str, Any]]:
        """With stream_options.include_usage: one last chunk with no choices and the usage."""
        if not self.req.include_usage:
            return []
        return [Completion(id=self.id, created=self.created, model=self.model, choices=[],
                           usage=UsageInfo.of(self._tracker.usage)).model_dump()]

    # -- whole response --

    def add(self, item: tuple[int, OutputDelta]) -> None:
        piece = self._piece(*item)
        self._text.setdefault(piece.index, []).append(piece.text)
        if piece.logprobs is not None:
            self._logprobs.setdefault(piece.index, []).append(piece.logprobs)

    def response(self) -> dict[str, Any]:
        choices = [
            CompletionChoice(
                index=i,
                text="".join(self._text[i]),
                logprobs=merge_completion_logprobs(self._logprobs.get(i, [])) if self.req.logprobs is not None
                else None,
                finish_reason=self._tracker.finish_reasons.get(i),
            )
            for i in sorted(self._text)
        ]
        return Completion(id=self.id, created=self.created, model=self.model, choices=choices,
                          usage=UsageInfo.of(self._tracker.usage)).model_dump()
