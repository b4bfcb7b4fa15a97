"""OutputProcessor: the text of every backend's token-level deltas, made in the front end.

Every backend (the native engine core, in-process or behind the process boundary, and TensorRT-LLM) yields deltas
of token ids, logprobs and finish reasons, without text. One `RequestOutput` per request turns them into the
deltas callers see: incremental detokenization (runtime/detokenizer.py), stop strings (runtime/stop.py) matched
only once `min_tokens` tokens were generated, text held back while it may still start a stop string, and the
finish reasons that text decides.

Stop rules (vLLM's, which OpenAI clients expect), text side:
- a stop token id or eos ended the sample in the backend; the id stays in `token_ids` (and usage) and its text is
  not shown, unless include_stop_str_in_output for a stop token id (stop_reason is the id; None for eos, and for a
  grammar that ended). TensorRT-LLM leaves such a token out of its ids itself (`hides_stop_tokens` False);
- a stop string ends the sample: text is cut before it (or after it with include_stop_str_in_output), stop_reason
  is the string, and the token that completed it is the sample's last;
- a sample ending on "length" whose held-back tail completes a stop string ends "stop" on that string.

When a stop string matches here, the backend has gone on for a step or two: the delta is cut at the matching
token, `process` asks the caller to abort that sample in the backend, the sample's later tokens are dropped, and
the cut delta goes out when the backend's last delta of the sample comes, with its extras (logits) and the
request's usage less every dropped token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.detokenizer import IncrementalDetokenizer
from runtime.request import GenerationRequest, OutputDelta, SamplingOptions
from runtime.stop import StopStringMatcher
from runtime.tokenizer import Tokenizer


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


@dataclass
class _Sample:
    text: SampleText
    num_tokens: int = 0  # tokens kept (counted for min_tokens)
    cut: OutputDelta | None = None  # the delta a stop string ended, until the backend's last delta of the sample


class OutputProcessor:
    """Makes the text of one backend's requests (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, *, hides_stop_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        _ = tokenizer.byte_pieces  # the detokenizers' table, built now (at load time), not on the first request
        # True: a stop token id or eos that ended a sample is the last of its ids, its text not shown (see above)
        self.hides_stop_tokens = hides_stop_tokens

    def add_request(self, request: GenerationRequest, prompt_token_ids: Sequence[int]) -> RequestOutput:
        return RequestOutput(self, request.sampling, prompt_token_ids)


class RequestOutput:
    """One request's text state: `process` each batch of its backend's deltas, in order."""

    def __init__(self, processor: OutputProcessor, options: SamplingOptions, prompt_token_ids: Sequence[int]) -> None:
        self._hides_stop_tokens = processor.hides_stop_tokens
        self._tokenizer, self._options, self._prompt = processor.tokenizer, options, prompt_token_ids
        self._samples: dict[int, _Sample] = {}
        self._dropped = 0  # tokens the backend produced past a stop string matched here, over every sample

    def process(self, deltas: list[OutputDelta]) -> tuple[list[OutputDelta], list[int]]:
        """(the deltas with their text, less those held back; the samples whose stop string matched here, which the
        backend must now end)."""
        out: list[OutputDelta] = []
        ended: list[int] = []
        for delta in deltas:
            sample = self._samples.get(delta.index)
            if sample is None:
                sample = self._samples[delta.index] = _Sample(SampleText(self._tokenizer, self._options, self._prompt))
            if sample.cut is not None:  # the backend goes on until it ends the sample: drop what it still sends
                self._dropped += len(delta.token_ids)
                if delta.finish_reason is not None:
                    out.append(self._release(sample, delta))
                continue
            if self._make_text(sample, delta):
                if delta.finish_reason is None:
                    ended.append(delta.index)
                    continue
                out.append(self._release(sample, delta))  # the backend's last delta of the sample: no abort needed
                continue
            out.append(self._with_usage(delta))
        return out, ended

    def _make_text(self, sample: _Sample, delta: OutputDelta) -> bool:
        """Fill `delta.text`; True when a stop string matched in it (it is then cut: `sample.cut`)."""
        tokens, finish, text, opts = delta.token_ids, delta.finish_reason, sample.text, self._options
        # a stop token id (stop_reason) or eos / a complete grammar (None) ended the sample in the backend
        stop_token = None
        if self._hides_stop_tokens and finish == "stop" and tokens and not isinstance(delta.stop_reason, str):
            stop_token = tokens[-1]
        body = tokens[:-1] if stop_token is not None else tokens
        if not text.matcher.active or sample.num_tokens + len(body) < opts.min_tokens:  # most deltas: one push
            sample.num_tokens += len(body)
            delta.text = text.detokenizer.push(body)
        else:  # token by token: a stop string may end the sample at any of them
            pieces = []
            for i, token_id in enumerate(body):
                sample.num_tokens += 1
                piece, matched = text.push((token_id,), sample.num_tokens >= opts.min_tokens)
                pieces.append(piece)
                if matched is not None:
                    delta.text = "".join(pieces)
                    self._cut(sample, delta, i + 1, matched)
                    return True
            delta.text = "".join(pieces)
        if stop_token is not None:
            sample.num_tokens += 1
            if isinstance(delta.stop_reason, int):  # eos and a grammar's end show no text
                delta.text += text.stop_token(stop_token)
        if finish is not None and finish != "error":
            tail, matched = text.close()
            delta.text += tail
            if matched is not None and finish == "length":
                delta.stop_reason, delta.finish_reason = matched, "stop"
        return False

    def _cut(self, sample: _Sample, delta: OutputDelta, kept: int, matched: str) -> None:
        """`delta`'s token `kept` - 1 completed stop string `matched`: the sample ends there."""
        tokens = delta.token_ids
        self._dropped += len(tokens) - kept
        if delta.logprobs is not None:
            if delta.cumulative_logprob is not None:
                delta.cumulative_logprob -= sum(lp.logprob for lp in delta.logprobs[kept:])
            delta.logprobs = delta.logprobs[:kept]
        delta.token_ids = tokens[:kept]
        sample.cut = OutputDelta(request_id=delta.request_id, index=delta.index, token_ids=delta.token_ids,
                                 text=delta.text, logprobs=delta.logprobs, finish_reason="stop", stop_reason=matched,
                                 cumulative_logprob=delta.cumulative_logprob, prompt_token_ids=delta.prompt_token_ids,
                                 prompt_logprobs=delta.prompt_logprobs)

    def _release(self, sample: _Sample, last: OutputDelta) -> OutputDelta:
        """The cut delta, completed by the backend's last delta of the sample `last` (usage, logits)."""
        cut = sample.cut
        assert cut is not None
        if last.finish_reason == "error":  # the backend failed before it saw the abort: the failure stands
            last.token_ids, last.text, last.logprobs = [], "", None
            return self._with_usage(last)
        cut.usage = last.usage
        if last.generation_logits is not None:
            cut.generation_logits = last.generation_logits[: sample.num_tokens]
        cut.context_logits = last.context_logits
        return self._with_usage(cut)

    def _with_usage(self, delta: OutputDelta) -> OutputDelta:
        """`delta`, its usage (the request's last delta) less the tokens dropped after stop strings."""
        if delta.usage is not None and self._dropped:
            delta.usage.completion_tokens -= self._dropped
            self._dropped = 0
        return delta
