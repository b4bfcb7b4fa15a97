"""Deltas -> /v1/completions responses and stream chunks."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from adapters.openai.choices import ChoiceTracker, EndpointOutput
from adapters.openai.logprobs import CompletionLogprobsBuilder, merge_completion_logprobs
from adapters.openai.requests import CompletionRequest
from adapters.openai.responses import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    completion_chunk_choice,
    stream_chunk,
)
from runtime.request import OutputDelta
from runtime.tokenizer import Tokenizer


def _prompt_only(delta: OutputDelta) -> OutputDelta:
    """A scoring request's delta without the one token the engine generated (max_tokens 0 ends at "length")."""
    usage = None if delta.usage is None else dataclasses.replace(delta.usage, completion_tokens=0)
    finish = "length" if delta.finish_reason in ("length", "stop") else delta.finish_reason
    return msgspec.structs.replace(delta, token_ids=[], text="", logprobs=None, finish_reason=finish,
                                    stop_reason=None, cumulative_logprob=None, usage=usage)


class CompletionOutput(EndpointOutput):
    """Turns `(prompt_index, delta)` items of one request into chunks (`chunks`) or one response (`add`,
    then `response`). Echo prepends the prompt (and its logprobs) to each choice's first text."""

    req: CompletionRequest
    _chunk_type = Completion  # OpenAI uses one object for the response and its chunks

    def __init__(self, req: CompletionRequest, response_id: str, model: str, tokenizer: Tokenizer,
                 created: int | None = None) -> None:
        super().__init__(req, response_id, model, tokenizer, created)
        self._tracker = ChoiceTracker(req.samples)  # best_of > n: every sample is a choice until the n best are kept
        self._scores: dict[int, float] = {}  # choice -> its tokens' summed logprob, to rank samples
        self._prompts = req.prompts()
        self._lp_builders: dict[int, CompletionLogprobsBuilder] = {}
        self._logprobs: dict[int, list[CompletionLogprobs]] = {}

    def _piece(self, prompt_index: int, delta: OutputDelta) -> tuple[int, str, CompletionLogprobs | None]:
        """(choice index, text, logprobs) of one delta."""
        if self.req.scores_prompt:
            delta = _prompt_only(delta)
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
        return choice, text, logprobs

    # -- streaming --

    def chunks(self, item: tuple[int, OutputDelta]) -> list[dict[str, Any]]:
        """Zero or one chunk for one delta (nothing when it carries no text, logprobs or finish)."""
        choice, text, logprobs = self._piece(*item)
        finish = item[1].finish_reason
        if not text and finish is None and not (logprobs and logprobs.tokens):
            return []
        # OpenAI: every chunk has usage null when usage is requested
        return [stream_chunk("text_completion", self.id, self.created, self.model,
                             completion_chunk_choice(choice, text, logprobs, finish), self.req.include_usage,
                             self._running_usage())]

    # -- whole response --

    def add(self, item: tuple[int, OutputDelta]) -> None:
        choice, text, logprobs = self._piece(*item)
        self._text.setdefault(choice, []).append(text)
        if logprobs is not None:
            self._logprobs.setdefault(choice, []).append(logprobs)
        entries = item[1].logprobs or []
        self._scores[choice] = self._scores.get(choice, 0.0) + sum(e.logprob for e in entries)

    def response(self) -> dict[str, Any]:
        choices = [
            CompletionChoice(
                index=index,
                text="".join(self._text[i]),
                logprobs=merge_completion_logprobs(self._logprobs.get(i, [])) if self.req.logprobs is not None
                else None,
                finish_reason=self._tracker.finish_reasons.get(i),
            )
            for index, i in enumerate(self._returned())
        ]
        return self._with_usage(Completion, choices)

    def _returned(self) -> list[int]:
        """The choices to return, in order: all of them, or per prompt the n samples of highest cumulative logprob
        (best_of > n; usage still counts every sample, as OpenAI bills them)."""
        if not self.req.ranks_samples:
            return sorted(self._text)
        samples, out = self.req.samples, []
        for prompt in range(len(self._prompts)):
            ranked = sorted((i for i in self._text if i // samples == prompt), key=lambda i: -self._scores[i])
            out += ranked[: self.req.n]
        return out
