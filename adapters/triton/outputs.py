"""Runtime output deltas -> generate-extension response objects and stream events.

Tensors are written the way Triton's generate endpoint writes them: flattened to one JSON list, and a
tensor of exactly one element as that bare element (so one prompt's `text_output` is a string, and
`cum_log_probs` of one beam a number). Like the backend's BLS/ensemble, `cum_log_probs` and
`output_log_probs` are always present (zeros unless `return_log_probs`); `context_logits` and
`generation_logits` only when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adapters.triton.generate import TritonGenerate
from runtime.errors import EngineFailedError
from runtime.request import OutputDelta


@dataclass
class SequenceResult:
    """One output sequence (a sample or a beam) accumulated over its deltas."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    cumulative_logprob: float | None = None
    generation_logits: Any = None
    finish_reason: str | None = None


@dataclass
class PromptResult:
    """Everything one runtime request (one prompt of the batch) produced."""

    prompt_token_ids: list[int] | None = None
    context_logits: Any = None
    sequences: dict[int, SequenceResult] = field(default_factory=dict)

    def add(self, delta: OutputDelta) -> None:
        """Accumulate one delta. A delta that reports an error raises EngineFailedError."""
        if delta.finish_reason == "error":
            raise EngineFailedError(delta.error or "generation failed")
        if delta.prompt_token_ids is not None:
            self.prompt_token_ids = list(delta.prompt_token_ids)
        if delta.context_logits is not None:
            self.context_logits = delta.context_logits
        seq = self.sequences.setdefault(delta.index, SequenceResult())
        seq.token_ids += delta.token_ids
        seq.text += delta.text
        if delta.logprobs:
            seq.logprobs += [lp.logprob for lp in delta.logprobs]
        if delta.cumulative_logprob is not None:
            seq.cumulative_logprob = delta.cumulative_logprob
        if delta.generation_logits is not None:
            seq.generation_logits = delta.generation_logits
        if delta.finish_reason is not None:
            seq.finish_reason = delta.finish_reason


def tensor_json(flat: list[Any]) -> Any:
    """A flattened output tensor as Triton's generate endpoint writes it (one element: bare)."""
    return flat[0] if len(flat) == 1 else flat


def _flatten(value: Any) -> list[Any]:
    """Nested lists / tensors -> one flat list of Python numbers."""
    if value is None:
        return []
    if hasattr(value, "detach"):  # torch tensor
        return value.detach().float().reshape(-1).cpu().tolist()
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        for v in value:
            out += _flatten(v) if isinstance(v, (list, tuple)) or hasattr(v, "detach") else [v]
        return out
    return [value]


def _padded(rows: list[list[Any]], pad: Any) -> list[Any]:
    """Rows of a [beam, len] tensor padded to the longest row, flattened."""
    width = max((len(r) for r in rows), default=0)
    return [v for r in rows for v in r + [pad] * (width - len(r))]


def _head(gen: TritonGenerate) -> dict[str, Any]:
    return {"model_name": gen.model_name, "model_version": gen.model_version}


def _tail(gen: TritonGenerate, body: dict[str, Any], batch_index: int, seq_index: int | None) -> dict[str, Any]:
    if gen.batched:
        body["batch_index"] = batch_index
    if seq_index is not None:
        body["sequence_index"] = seq_index
    if gen.ensemble_fields:
        body.update(sequence_end=False, sequence_id=0, sequence_start=False)
    return body


def _groups(gen: TritonGenerate, result: PromptResult) -> list[tuple[int | None, list[SequenceResult]]]:
    """Sequences answered together: beams share one response; samples (n > 1) get one each."""
    ordered = [result.sequences[i] for i in sorted(result.sequences)]
    if gen.num_return_sequences > 1:
        return [(i, [s]) for i, s in zip(sorted(result.sequences), ordered)]
    return [(None, ordered or [SequenceResult()])]


def _logprob_fields(gen: TritonGenerate, seqs: list[SequenceResult]) -> dict[str, Any]:
    if gen.return_log_probs:
        cum = [s.cumulative_logprob if s.cumulative_logprob is not None else sum(s.logprobs) for s in seqs]
        rows = [s.logprobs for s in seqs]
    else:  # the backend answers zeros of the same shapes
        cum = [0.0 for _ in seqs]
        rows = [[0.0] * len(s.token_ids) for s in seqs]
    return {"cum_log_probs": tensor_json(cum), "output_log_probs": tensor_json(_padded(rows, 0.0))}


def _logits_fields(gen: TritonGenerate, result: PromptResult, seqs: list[SequenceResult]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if gen.return_context_logits:
        out["context_logits"] = tensor_json(_flatten(result.context_logits))
    if gen.return_generation_logits:
        out["generation_logits"] = tensor_json([v for s in seqs for v in _flatten(s.generation_logits)])
    return out


def generate_responses(gen: TritonGenerate, results: list[PromptResult]) -> list[dict[str, Any]]:
    """One response object per prompt (and per sample when num_return_sequences > 1), in order."""
    out: list[dict[str, Any]] = []
    for b, result in enumerate(results):
        for seq_index, seqs in _groups(gen, result):
            body = _head(gen)
            if gen.kind == "text":
                prefix = "" if gen.exclude_input_in_output else gen.prompts[b]
                body["text_output"] = tensor_json([prefix + s.text for s in seqs])
            else:
                prompt = [] if gen.exclude_input_in_output else list(gen.prompts[b])
                rows = [prompt + s.token_ids for s in seqs]
                body["output_ids"] = tensor_json(_padded(rows, gen.pad_id))
                body["sequence_length"] = tensor_json([len(r) for r in rows])
            body.update(_logprob_fields(gen, seqs))
            body.update(_logits_fields(gen, result, seqs))
            out.append(_tail(gen, body, b, seq_index))
    return out


class StreamRenderer:
    """Turns `(prompt_index, delta)` items into stream events, one per delta (new text/ids only).

    As the backend in streaming mode, events never repeat the prompt, whatever
    exclude_input_in_output says. `cum_log_probs` is the running sum of the sequence so far.
    """

    def __init__(self, gen: TritonGenerate) -> None:
        self.gen = gen
        self._results: dict[int, PromptResult] = {}

    def __call__(self, item: tuple[int, OutputDelta]) -> list[dict[str, Any]]:
        b, delta = item
        gen = self.gen
        result = self._results.setdefault(b, PromptResult())
        result.add(delta)
        seq = result.sequences[delta.index]
        body = _head(gen)
        if gen.kind == "text":
            body["text_output"] = delta.text
        else:
            body["output_ids"] = tensor_json(list(delta.token_ids))
            body["sequence_length"] = len(delta.token_ids)
        if gen.return_log_probs:
            new = [lp.logprob for lp in delta.logprobs or []]
            cum = seq.cumulative_logprob if seq.cumulative_logprob is not None else sum(seq.logprobs)
        else:
            new = [0.0] * len(delta.token_ids)
            cum = 0.0
        body["cum_log_probs"] = cum
        body["output_log_probs"] = tensor_json(new)
        if delta.finish_reason is not None:
            if gen.return_context_logits:
                body["context_logits"] = tensor_json(_flatten(result.context_logits))
            if gen.return_generation_logits:
                body["generation_logits"] = tensor_json(_flatten(seq.generation_logits))
        several = gen.num_return_sequences > 1 or gen.beam_width > 1
        return [_tail(gen, body, b, delta.index if several else None)]


class ResponseCollector:
    """Accumulates `(prompt_index, delta)` items; `responses()` renders the complete answers."""

    def __init__(self, gen: TritonGenerate) -> None:
        self.gen = gen
        self.results = [PromptResult() for _ in gen.requests]

    def __call__(self, item: tuple[int, OutputDelta]) -> list[dict[str, Any]]:
        b, delta = item
        self.results[b].add(delta)
        return []  # nothing to stream until the end

    def responses(self) -> list[dict[str, Any]]:
        return generate_responses(self.gen, self.results)
