"""Output text: incremental detokenization and stop strings, for the engine core or for the front end.

`SampleText` turns one sample's tokens into text under the stop rules of runtime/request_state.py. The
native engine uses it in-process; behind the process split (runtime/process) the core sends token ids only
and the front end's `FrontEndText` makes the text of each step's deltas, so this per-token Python runs in the
front ends (one per --api-servers process), not in the single engine core.

When a stop string matches in the front end, the core has already been asked for a step or two more: the front
end cuts the delta at the matching token, aborts the request in the core, drops the tokens that still arrive,
and sends the cut delta when the core's last delta comes, with that delta's usage less the dropped tokens.
Requests with n > 1 or beams keep their text in the core (`text_in_front_end`): a stop string there ends one
sample of several, and their steps wait for the host anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.detokenizer import IncrementalDetokenizer
from runtime.request import OutputDelta, SamplingOptions
from runtime.stop import StopStringMatcher
from runtime.tokenizer import Tokenizer


def text_in_front_end(options: SamplingOptions) -> bool:
    """Whether, behind the process split, the front end makes this request's text (else the core does)."""
    return options.n == 1 and options.beam_width == 1


class SampleText:
    """Text and stop-string state of one sample."""

    def __init__(self, tokenizer: Tokenizer, options: SamplingOptions, prompt_token_ids: Sequence[int]) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids, options.skip_special_tokens)
        self.matcher = StopStringMatcher(options.stop, options.include_stop_str_in_output)
        self._include_stop = options.include_stop_str_in_output

    def push(self, token_ids: Sequence[int], may_stop: bool = True) -> tuple[str, str | None]:
        """Ordinary tokens: (text to emit, the stop string they completed or None)."""
        text = self.detokenizer.push(token_ids)
        return self.matcher.push(text) if may_stop else (text, None)

    def stop_token(self, token_id: int) -> str:
        """A stop token id that ends the sample: its text only with include_stop_str_in_output."""
        return self.detokenizer.push([token_id]) if self._include_stop else ""

    def close(self) -> tuple[str, str | None]:
        """Text held back at the end of the sample, and the stop string its tail completes (or None)."""
        if self.matcher.matched is not None:
            return "", None
        tail, matched = self.matcher.push(self.detokenizer.flush())
        return tail + (self.matcher.flush() if matched is None else ""), matched


class FrontEndText:
    """The text of one request (n == 1) whose core sends token ids only (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, options: SamplingOptions, prompt_token_ids: Sequence[int]) -> None:
        self.text = SampleText(tokenizer, options, prompt_token_ids)
        self.min_tokens = options.min_tokens
        self.num_tokens = 0
        self.cut: OutputDelta | None = None  # the delta a front-end stop string ended, until the core's last
        self.dropped = 0  # tokens the core produced past the stop string

    def process(self, delta: OutputDelta) -> tuple[OutputDelta | None, bool]:
        """(the delta with its text, or None while held; whether the core must now abort the request)."""
        if self.cut is not None:
            self.dropped += len(delta.token_ids)
            return (self._release(delta), False) if delta.finish_reason is not None else (None, False)
        tokens, finish, text = delta.token_ids, delta.finish_reason, self.text
        # a stop token id (stop_reason) or eos / a complete grammar (None) ended the sample in the core
        stop_token = tokens[-1] if finish == "stop" and tokens and not isinstance(delta.stop_reason, str) else None
        body = tokens[:-1] if stop_token is not None else tokens
        if not text.matcher.active or self.num_tokens + len(body) < self.min_tokens:  # most deltas: one push
            self.num_tokens += len(body)
            delta.text = text.detokenizer.push(body)
        else:  # token by token: a stop string may end the sample at any of them
            pieces = []
            for i, token_id in enumerate(body):
                self.num_tokens += 1
                piece, matched = text.push((token_id,), self.num_tokens >= self.min_tokens)
                pieces.append(piece)
                if matched is not None:
                    delta.text = "".join(pieces)
                    return self._cut(delta, i + 1, matched)
            delta.text = "".join(pieces)
        if stop_token is not None:
            self.num_tokens += 1
            delta.text += text.stop_token(stop_token)
        if finish is not None and finish != "error":
            tail, matched = text.close()
            delta.text += tail
            if matched is not None and finish == "length":
                delta.stop_reason, delta.finish_reason = matched, "stop"
        return delta, False

    def _cut(self, delta: OutputDelta, kept: int, matched: str) -> tuple[OutputDelta | None, bool]:
        """`delta`'s token `kept` - 1 completed stop string `matched`: the sample ends there."""
        tokens = delta.token_ids
        self.dropped = len(tokens) - kept
        if delta.logprobs is not None:
            if delta.cumulative_logprob is not None:
                delta.cumulative_logprob -= sum(lp.logprob for lp in delta.logprobs[kept:])
            delta.logprobs = delta.logprobs[:kept]
        delta.token_ids = tokens[:kept]
        final = delta.finish_reason is not None
        self.cut = OutputDelta(request_id=delta.request_id, index=delta.index, token_ids=delta.token_ids,
                               text=delta.text, logprobs=delta.logprobs, finish_reason="stop", stop_reason=matched,
                               cumulative_logprob=delta.cumulative_logprob, prompt_token_ids=delta.prompt_token_ids,
                               prompt_logprobs=delta.prompt_logprobs)
        if final:
            return self._release(delta), False
        return None, True

    def _release(self, last: OutputDelta) -> OutputDelta:
        """The cut delta, completed by the core's last delta `last` (usage, logits) less the dropped tokens."""
        cut = self.cut
        assert cut is not None
        if last.finish_reason == "error":  # the core failed before it saw the abort: the failure stands
            last.token_ids, last.text, last.logprobs = [], "", None
            return last
        if last.usage is not None:
            last.usage.completion_tokens -= self.dropped
            cut.usage = last.usage
        if last.generation_logits is not None:
            cut.generation_logits = last.generation_logits[: self.num_tokens]
        cut.context_logits = last.context_logits
        return cut
