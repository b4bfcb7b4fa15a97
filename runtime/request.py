"""What a caller hands the engine (GenerationRequest) and what it gets back (OutputDelta).

Both backends speak exactly these types; the protocol adapters translate to and from them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

FinishReason = Literal["stop", "length", "abort", "error", "tool_calls"]


@dataclass
class SamplingOptions:
    """Per-request decoding knobs. Neutral defaults mean "off"."""

    max_tokens: int | None = None  # None: the engine's default_max_tokens, within the context window
    temperature: float = 1.0  # 0: greedy
    top_k: int = 0  # 0: all tokens
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    length_penalty: float = 1.0  # beam search only
    min_tokens: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    bad_words: list[str] = field(default_factory=list)  # banned token sequences, as text
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    n: int = 1  # independent samples sharing the prompt's KV blocks
    beam_width: int = 1  # > 1: beam search, returns beam_width beams
    logprobs: int | None = None  # None: none; 0: sampled token only; k: plus top-k alternatives
    prompt_logprobs: int | None = None  # same for prompt tokens (OpenAI echo + logprobs)
    return_context_logits: bool = False
    return_generation_logits: bool = False
    skip_special_tokens: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def output_limit(self, room: int, default: int | None) -> int:
        """The tokens this request may generate: its max_tokens, else `default` (EngineConfig.default_max_tokens;
        None: no default) within the `room` the prompt leaves in the context window."""
        if self.max_tokens is not None:
            return self.max_tokens
        return room if default is None else min(default, room)


@dataclass
class GuidedDecoding:
    """Constrain output to a grammar. Exactly one field is set."""

    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None  # EBNF
    # xgrammar's / TensorRT-LLM's structural tag: {"type": "structural_tag", "format": {...}} (tool calls)
    structural_tag: dict[str, Any] | None = None
    param: str = "guided_decoding"  # the request field the constraint came from: named in errors, not a constraint


@dataclass
class LoraTask:
    """A Triton-style LoRA task: `task_id`, with `weights` and `config` in TensorRT-LLM's format on first
    use (rows [module_id, layer_idx, rank] and their flattened A/B rows), the id alone afterwards."""

    task_id: int
    weights: Any = None  # [rows, R*Hin + Hout*R] numbers
    config: Any = None  # [rows, 3] ints


@dataclass
class GenerationRequest:
    """One prompt to complete. `prompt` text or `prompt_token_ids` (ids win when both are given)."""

    request_id: str
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    adapter: str | None = None  # LoRA adapter name; None = base model
    lora_task: LoraTask | None = None  # Triton lora_task_id (+ weights/config); exclusive with `adapter`
    num_draft_tokens: int | None = None  # speculation: None = engine default, 0 = off
    use_draft_logits: bool = False
    guided: GuidedDecoding | None = None
    add_special_tokens: bool = True  # when tokenising `prompt`
    # False: the caller wants only the finished output, so the engine hands deltas over once, at the end,
    # instead of one thread-to-event-loop hand-off per step (what dominated non-streamed latency)
    stream: bool = True
    arrival_time: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # time.monotonic() value after which the request is aborted


@dataclass
class TokenLogprob:
    """Log-probability of one chosen token, with its top alternatives (id, logprob), best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class OutputDelta(msgspec.Struct, array_like=True):
    """What one sequence of a request produced since the last delta.

    A request with n > 1 (or beam_width > 1) yields deltas for each `index`. Every sequence's last
    delta carries `finish_reason`; the request's very last delta also carries `usage` (summed over
    all its sequences).

    A msgspec Struct encoded as an array, without field names: a step message of 256 deltas is 28 KB
    instead of 71 KB as a dataclass (a map of 15 named fields), and is built and encoded 4x and decoded
    3x faster (benchmarks/RESULTS.md, 2026-11-26 12:00-12:20).
    """

    request_id: str
    index: int = 0
    token_ids: list[int] = msgspec.field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    cumulative_logprob: float | None = None
    prompt_token_ids: list[int] | None = None  # on the request's first delta only
    prompt_logprobs: list[TokenLogprob | None] | None = None  # first delta, when asked
    context_logits: Any = None  # final delta, when asked: float32 array [prompt_len, vocab] (numpy; TensorRT-LLM's torch)
    generation_logits: Any = None  # final delta, when asked: float32 array [generated, vocab]
    usage: Usage | None = None
    error: str | None = None  # with finish_reason "error"
    time: float | None = None  # time.monotonic() when the engine produced it (metrics of held deltas)


def coalesce(deltas: list[OutputDelta]) -> list[OutputDelta]:
    """`deltas` of one request, each sequence's consecutive deltas merged into one.

    A front end that falls behind the engine finds several steps' deltas waiting at once; writing one event
    per delta would cost it per token what one event costs per batch (vLLM's output collector merges them the
    same way). A merged delta takes its sequence's latest place, so the request's last delta (with `usage`)
    stays last, and keeps its first part's time (the metrics' time to first token). A delta ending in "error"
    or "abort" is never merged: the tokens before it must still be delivered when it is raised.
    """
    if len(deltas) < 2:
        return deltas
    merged: dict[int, OutputDelta] = {}  # sequence index -> its merged delta, in the order of their latest parts
    out: list[OutputDelta] = []
    for delta in deltas:
        last = merged.get(delta.index)
        if last is not None and last.finish_reason is None and delta.prompt_token_ids is None \
                and delta.finish_reason not in ("error", "abort"):
            del merged[delta.index]  # re-inserted: its latest part is now the last one
            merged[delta.index] = _joined(last, delta)
            continue
        if last is not None or delta.finish_reason in ("error", "abort"):  # everything before it goes out first
            out.extend(merged.values())
            merged.clear()
        merged[delta.index] = delta
    out.extend(merged.values())
    return out


def _joined(first: OutputDelta, then: OutputDelta) -> OutputDelta:
    """One delta carrying `first`'s tokens and then `then`'s (a new object; neither is changed)."""
    logprobs = None if first.logprobs is None and then.logprobs is None else [*(first.logprobs or ()),
                                                                              *(then.logprobs or ())]
    return msgspec.structs.replace(
        first, token_ids=first.token_ids + then.token_ids, text=first.text + then.text, logprobs=logprobs,
        finish_reason=then.finish_reason, stop_reason=then.stop_reason,
        cumulative_logprob=first.cumulative_logprob if then.cumulative_logprob is None else then.cumulative_logprob,
        context_logits=then.context_logits, generation_logits=then.generation_logits, usage=then.usage,
        error=then.error)
