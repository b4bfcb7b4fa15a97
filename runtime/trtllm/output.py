"""SequenceStream: one output sequence's TensorRT-LLM updates -> OutputDelta text, tokens, logprobs.

Reads CompletionOutput's incremental views (token_ids_diff, logprobs_diff; NVIDIA/TensorRT-LLM
tensorrt_llm/executor/result.py @ a678b91aafbeff265cd0b764abb59d7def624ac2). Text is made here, with the
native engine's SampleText (runtime/output_text.py), so both backends turn the same tokens
into the same text and stop at the same place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.output_text import SampleText
from runtime.request import FinishReason, OutputDelta, SamplingOptions, TokenLogprob
from runtime.tokenizer import Tokenizer

# CompletionOutput.finish_reason -> ours ('timeout' is TRT-LLM's own per-request timeout).
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "cancelled": "abort",
                                    "timeout": "abort"}


def convert_logprobs(token_ids: Sequence[int], entries: Sequence[Any], top_k: int) -> list[TokenLogprob]:
    """TRT-LLM logprobs (per token: {id: Logprob(logprob, rank)} or a float) -> TokenLogprob list."""
    out: list[TokenLogprob] = []
    for token, entry in zip(token_ids, entries):
        if isinstance(entry, dict):
            chosen = entry.get(token)
            ranked = sorted(entry.items(), key=lambda kv: (kv[1].rank is None, kv[1].rank or 0,
                                                           -kv[1].logprob))
            top = [(int(t), float(lp.logprob)) for t, lp in ranked[:top_k]]
            out.append(TokenLogprob(int(token), float(chosen.logprob) if chosen else float("-inf"), top))
        else:
            out.append(TokenLogprob(int(token), float(entry), []))
    return out


def convert_prompt_logprobs(prompt: Sequence[int], entries: Sequence[Any] | None,
                            top_k: int) -> list[TokenLogprob | None] | None:
    """Per prompt token; the first has none (nothing precedes it), as OutputDelta.prompt_logprobs."""
    if not entries:
        return None
    rows = convert_logprobs(prompt[len(prompt) - len(entries):], entries, top_k)
    return [None] * (len(prompt) - len(rows)) + list(rows)


class SequenceStream:
    """Text and stop-string state of one output index of one request."""

    def __init__(self, tokenizer: Tokenizer, options: SamplingOptions, request_id: str, index: int,
                 eos_token_ids: Sequence[int]) -> None:
        self.request_id = request_id
        self.index = index
        self._options = options
        self._text = SampleText(tokenizer, options, ())
        # eos ids other than end_id reach TRT-LLM as stop_token_ids; report them as end of sequence.
        self._eos_only = set(eos_token_ids) - set(options.stop_token_ids)
        self.finished = False
        self.num_tokens = 0

    def update(self, output: Any) -> OutputDelta | None:
        """Delta for what `output` (a CompletionOutput) added; None when nothing new and not finished."""
        if self.finished:
            return None
        new_ids = [int(t) for t in output.token_ids_diff]
        text, matched = self._text.push(new_ids)
        reason = _FINISH.get(output.finish_reason) if output.finish_reason else None
        stop_reason: str | int | None = None
        if matched is not None:
            reason, stop_reason = "stop", matched
        elif reason is not None:
            tail, matched = self._text.close()
            text += tail
            if matched is not None:
                reason, stop_reason = "stop", matched
            elif reason == "stop" and output.stop_reason not in self._eos_only:
                stop_reason = output.stop_reason
        logprobs = None
        if self._options.logprobs is not None:
            logprobs = convert_logprobs(new_ids, list(output.logprobs_diff), self._options.logprobs)
        if not new_ids and not text and reason is None:
            return None
        self.num_tokens += len(new_ids)
        self.finished = reason is not None
        return OutputDelta(request_id=self.request_id, index=self.index, token_ids=new_ids, text=text,
                           logprobs=logprobs, finish_reason=reason, stop_reason=stop_reason,
                           cumulative_logprob=output.cumulative_logprob if self.finished else None)

    def finish(self, reason: FinishReason) -> OutputDelta | None:
        """Close the sequence from our side (deadline, engine abort); None if already finished."""
        if self.finished:
            return None
        self.finished = True
        return OutputDelta(request_id=self.request_id, index=self.index, finish_reason=reason)

    def final_text(self, token_ids: Sequence[int]) -> tuple[str, str | None]:
        """Whole text of a sequence delivered at once (beam search): (text, matched stop string)."""
        text, matched = self._text.push(token_ids)
        if matched is None:
            tail, matched = self._text.close()
            text += tail
        return text, matched
