"""SequenceStream: one output sequence's TensorRT-LLM updates -> token-level OutputDeltas (tokens, logprobs, finish).

How TensorRT-LLM fills CompletionOutput (NVIDIA/TensorRT-LLM tensorrt_llm/executor/result.py @
a678b91aafbeff265cd0b764abb59d7def624ac2, GenerationResultBase._handle_sequence): each runtime response
updates ONE sequence (`sequence_index`), so with n > 1 the others keep their previous token_ids_diff and
logprobs_diff. A stream therefore reads `token_ids[seen:]` of its own output, never the diffs. Finish reasons
are set only on the request's last response, for that response's sequence: a sequence that ended earlier
(n > 1) shows no finish reason and keeps its stop token in token_ids, so a stop token id ends the sequence
here (cut unless include_stop_str_in_output, as TensorRT-LLM cuts it), and a sequence still open when the
request finishes ended on the end id, or on max_tokens (`close`).

Text and stop strings are the front end's OutputProcessor's (runtime/output_processor.py), as for the native
engine, so both backends turn the same tokens into the same text and stop at the same place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.request import FinishReason, OutputDelta, SamplingOptions, TokenLogprob

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


def convert_prompt_logprobs(prompt: Sequence[int], rows: Sequence[Any] | None,
                            top_k: int) -> list[TokenLogprob | None] | None:
    """TensorRT-LLM's prompt rows -> one entry per prompt token, as OutputDelta.prompt_logprobs.

    Row t is the distribution after prompt token t (tensorrt_llm/executor/result.py compute_logprobs on the
    context logits), so it describes token t + 1; the first token has none and the last row (the first
    generated token) is not the prompt's. 1.2 keeps the top-k of each row only: a token outside it has no
    logprob (None), as the first token."""
    if not rows:
        return None
    out: list[TokenLogprob | None] = [None]
    for token, row in zip(prompt[1:], rows):
        out += convert_logprobs([token], [row], top_k) if token in row else [None]
    return out + [None] * (len(prompt) - len(out))


class SequenceStream:
    """Tokens and finish state of one output index of one request."""

    def __init__(self, options: SamplingOptions, request_id: str, index: int, eos_token_ids: Sequence[int]) -> None:
        self.request_id = request_id
        self.index = index
        self._options = options
        # eos ids other than the end id reach TRT-LLM as stop_token_ids; report them as end of sequence.
        self._eos_only = set(eos_token_ids) - set(options.stop_token_ids)
        self._stop_ids = set(options.stop_token_ids) | (set() if options.ignore_eos else set(eos_token_ids))
        self._seen = 0  # tokens of output.token_ids read so far
        self.finished = False
        self.num_tokens = 0

    def update(self, output: Any) -> OutputDelta | None:
        """Delta for what `output` (a CompletionOutput) added; None when nothing new and not finished."""
        if self.finished:
            return None
        new_ids = [int(t) for t in output.token_ids[self._seen:]]
        entries = list(output.logprobs[self._seen: self._seen + len(new_ids)]) if self._options.logprobs is not None \
            else []
        self._seen = max(self._seen, len(output.token_ids))
        reason = _FINISH.get(output.finish_reason) if output.finish_reason else None
        token_stop: int | None = None
        if reason is None:  # a sequence that ended before the request's last response (n > 1)
            for i, token in enumerate(new_ids):
                if token in self._stop_ids:
                    keep = i + 1 if self._options.include_stop_str_in_output else i
                    new_ids, entries, reason, token_stop = new_ids[:keep], entries[:keep], "stop", token
                    break
        elif reason == "stop":
            token_stop = output.stop_reason if isinstance(output.stop_reason, int) else None
        return self._delta(new_ids, entries, reason, token_stop, output.cumulative_logprob)

    def close(self, max_tokens: int) -> OutputDelta | None:
        """The request finished while this sequence had no finish reason: it ended on the end id (not
        output) or on max_tokens; None if already finished."""
        if self.finished:
            return None
        return self._delta([], [], "length" if self.num_tokens >= max_tokens else "stop", None, None)

    def _delta(self, new_ids: list[int], entries: list[Any], reason: FinishReason | None, token_stop: int | None,
               cumulative_logprob: float | None) -> OutputDelta | None:
        if not new_ids and reason is None:
            return None
        stop_reason = token_stop if reason is not None and token_stop not in self._eos_only else None
        logprobs = convert_logprobs(new_ids, entries, self._options.logprobs) \
            if self._options.logprobs is not None else None
        self.num_tokens += len(new_ids)
        self.finished = reason is not None
        return OutputDelta(request_id=self.request_id, index=self.index, token_ids=new_ids, logprobs=logprobs,
                           finish_reason=reason, stop_reason=stop_reason,
                           cumulative_logprob=cumulative_logprob if self.finished else None)

    def finish(self, reason: FinishReason) -> OutputDelta | None:
        """Close the sequence from our side (deadline, engine abort); None if already finished."""
        if self.finished:
            return None
        self.finished = True
        return OutputDelta(request_id=self.request_id, index=self.index, finish_reason=reason)
