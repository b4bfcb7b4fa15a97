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
    """Nested lists / arrays (the native engine's numpy, TensorRT-LLM's torch) -> one flat list of Python numbers."""
    if value is None:
        return []
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().float().cpu()
    if hasattr(value, "reshape"):
        return value.reshape(-1).tolist()
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        for v in value:
            out += _flatten(v) if isinstance(v, (list, tuple)) or hasattr(v, "reshape") else [v]
        return out
    return [value]


def _padded(rows: list[list[Any]], pad: Any) -> list[Any]:
    """Rows of a [beam, len] tensor padded to the longest row, flattened."""
    width = max((len(r) for r in rows), default=0)
    return [v for r in rows for v in r + [pad] * (width - len(r))]


def _head(gen: TritonGenerate) -> dict[str, Any]:
    return {"model_name": gen.model_name, "model_version": gen.model_version}


def _width(rows: list[list[Any]]) -> int:
    return max((len(r) for r in rows), default=0)


def _shape(value: Any) -> list[int]:
    """The dims of a tensor or nested list (None: no elements)."""
    if value is None:
        return [0]
    if hasattr(value, "shape"):
        return list(value.shape)
    dims: list[int] = []
    while isinstance(value, (list, tuple)):
        dims.append(len(value))
        value = value[0] if value else None
    return dims


# One output tensor of one response: (name, KServe datatype, shape with the batch dim, flat values).
OutputTensor = tuple[str, str, list[int], list[Any]]


def _index_outputs(b: int, seq_index: int | None) -> list[OutputTensor]:
    out: list[OutputTensor] = [("batch_index", "INT32", [1, 1], [b])]
    if seq_index is not None:
        out.append(("sequence_index", "INT32", [1, 1], [seq_index]))
    return out


def _logprob_outputs(gen: TritonGenerate, seqs: list[SequenceResult]) -> list[OutputTensor]:
    if gen.return_log_probs:
        cum = [s.cumulative_logprob if s.cumulative_logprob is not None else sum(s.logprobs) for s in seqs]
        rows = [s.logprobs for s in seqs]
    else:  # the backend answers zeros of the same shapes
        cum = [0.0 for _ in seqs]
        rows = [[0.0] * len(s.token_ids) for s in seqs]
    return [("cum_log_probs", "FP32", [1, len(seqs)], cum),
            ("output_log_probs", "FP32", [1, len(seqs), _width(rows)], _padded(rows, 0.0))]


def _logits_outputs(gen: TritonGenerate, result: PromptResult, seqs: list[SequenceResult]) -> list[OutputTensor]:
    out: list[OutputTensor] = []
    if gen.return_context_logits:
        values = _flatten(result.context_logits)
        out.append(("context_logits", "FP32", [1, *_shape(result.context_logits)] if values else [1, 0], values))
    if gen.return_generation_logits:
        values = [v for s in seqs for v in _flatten(s.generation_logits)]
        shapes = [_shape(s.generation_logits) for s in seqs]
        same = all(shape == shapes[0] for shape in shapes) and values
        out.append(("generation_logits", "FP32", [1, len(seqs), *shapes[0]] if same else [1, len(values)], values))
    return out


def response_outputs(gen: TritonGenerate, result: PromptResult, b: int, seq_index: int | None,
                     seqs: list[SequenceResult]) -> list[OutputTensor]:
    """The complete answer of prompt `b` (one response: its beams, or one sample), as output tensors."""
    if gen.kind == "text":
        prefix = "" if gen.exclude_input_in_output else gen.prompts[b]
        out: list[OutputTensor] = [("text_output", "BYTES", [len(seqs)], [prefix + s.text for s in seqs])]
    else:
        prompt = [] if gen.exclude_input_in_output else list(gen.prompts[b])
        rows = [prompt + s.token_ids for s in seqs]
        out = [("output_ids", "INT32", [1, len(rows), _width(rows)], _padded(rows, gen.pad_id)),
               ("sequence_length", "INT32", [1, len(rows)], [len(r) for r in rows])]
    return out + _logprob_outputs(gen, seqs) + _logits_outputs(gen, result, seqs) + _index_outputs(b, seq_index)


def _body(gen: TritonGenerate, outputs: list[OutputTensor]) -> dict[str, Any]:
    """A generate-extension response object: each tensor flattened (batch_index only for a batch)."""
    body = _head(gen)
    body.update((name, tensor_json(values)) for name, _, _, values in outputs
                if name != "batch_index" or gen.batched)
    if gen.ensemble_fields:
        body.update(sequence_end=False, sequence_id=0, sequence_start=False)
    return body


def _groups(gen: TritonGenerate, result: PromptResult) -> list[tuple[int | None, list[SequenceResult]]]:
    """Sequences answered together: beams share one response; samples (n > 1) get one each."""
    ordered = [result.sequences[i] for i in sorted(result.sequences)]
    if gen.num_return_sequences > 1:
        return [(i, [s]) for i, s in zip(sorted(result.sequences), ordered)]
    return [(None, ordered or [SequenceResult()])]


def complete_outputs(gen: TritonGenerate, results: list[PromptResult]) -> list[list[OutputTensor]]:
    """Output tensors of every response: one per prompt (and per sample when num_return_sequences > 1)."""
    return [response_outputs(gen, result, b, seq_index, seqs)
            for b, result in enumerate(results) for seq_index, seqs in _groups(gen, result)]


def generate_responses(gen: TritonGenerate, results: list[PromptResult]) -> list[dict[str, Any]]:
    """One response object per prompt (and per sample when num_return_sequences > 1), in order."""
    return [_body(gen, outputs) for outputs in complete_outputs(gen, results)]


class StreamRenderer:
    """Turns `(prompt_index, delta)` items into stream events, one per delta (new text/ids only).

    As the backend in streaming mode, events never repeat the prompt, whatever
    exclude_input_in_output says. `cum_log_probs` is the running sum of the sequence so far.
    `outputs()` gives a delta's output tensors (KServe streams); calling the renderer gives the
    generate-extension event.
    """

    def __init__(self, gen: TritonGenerate) -> None:
        self.gen = gen
        self._results: dict[int, PromptResult] = {}

    def outputs(self, item: tuple[int, OutputDelta]) -> list[OutputTensor]:
        b, delta = item
        gen = self.gen
        result = self._results.setdefault(b, PromptResult())
        result.add(delta)
        seq = result.sequences[delta.index]
        n = len(delta.token_ids)
        if gen.kind == "text":
            out: list[OutputTensor] = [("text_output", "BYTES", [1], [delta.text])]
        else:
            out = [("output_ids", "INT32", [1, 1, n], list(delta.token_ids)),
                   ("sequence_length", "INT32", [1, 1], [n])]
        if gen.return_log_probs:
            new = [lp.logprob for lp in delta.logprobs or []]
            cum = seq.cumulative_logprob if seq.cumulative_logprob is not None else sum(seq.logprobs)
        else:
            new = [0.0] * n
            cum = 0.0
        out += [("cum_log_probs", "FP32", [1, 1], [cum]), ("output_log_probs", "FP32", [1, 1, len(new)], new)]
        if delta.finish_reason is not None:
            out += _logits_outputs(gen, result, [seq])
        several = gen.num_return_sequences > 1 or gen.beam_width > 1
        return out + _index_outputs(b, delta.index if several else None)

    def __call__(self, item: tuple[int, OutputDelta]) -> list[dict[str, Any]]:
        return [_body(self.gen, self.outputs(item))]


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
