"""Response and stream-chunk schemas, shaped like the official OpenAI API objects.

Fields listed in a class's `_omit_if_none` are left out when unset (as OpenAI leaves out, e.g.,
`delta.role` after the first chunk); every other field is always present, `null` included.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, model_serializer

from runtime.request import Usage


class _Wire(BaseModel):
    _omit_if_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        for name in self._omit_if_none:
            if data.get(name) is None:
                data.pop(name, None)
        return data


class PromptTokensDetails(_Wire):
    cached_tokens: int


class UsageInfo(_Wire):
    """Token counts. `prompt_tokens_details.cached_tokens` (prefix-cache hits) is always sent, 0 included,
    as OpenAI sends it: aiperf warns when it is absent."""

    _omit_if_none = frozenset({"prompt_tokens_details"})
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, usage: Usage) -> UsageInfo:
        return cls(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                   total_tokens=usage.total_tokens,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens))


def running_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """A stream chunk's usage with stream_options.continuous_usage_stats: the counts so far (vLLM's shape,
    without prompt_tokens_details: the cache hits are known with the final usage)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


# ----- /v1/completions -----

class CompletionLogprobs(_Wire):
    """Legacy completions logprobs: parallel lists, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(_Wire):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class Completion(_Wire):
    """Both the response and each stream chunk of /v1/completions (OpenAI uses one object for both)."""

    _omit_if_none = frozenset({"usage", "system_fingerprint"})
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


# ----- /v1/chat/completions -----

class TopLogprob(_Wire):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatChoiceLogprobs(_Wire):
    content: list[ChatTokenLogprob] | None
    refusal: None = None


class ChatResponseMessage(_Wire):
    """The assistant message; `refusal` is always null (nothing here refuses), and the official schema
    requires the key."""

    _omit_if_none = frozenset({"tool_calls", "reasoning_content"})
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    reasoning_content: str | None = None  # vLLM's field: the model's reasoning (adapters/openai/output_reader.py)
    tool_calls: list[dict[str, Any]] | None = None  # adapters/openai/tools.py ToolCall.wire()


class ChatChoice(_Wire):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None


class ChatCompletion(_Wire):
    _omit_if_none = frozenset({"system_fingerprint"})
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: UsageInfo


class ChatDelta(_Wire):
    """A chunk's delta. The role chunk carries `refusal: null`, as OpenAI's first chunk does; later ones
    leave it out."""

    _omit_if_none = frozenset({"role", "content", "reasoning_content", "tool_calls"})
    role: Literal["assistant"] | None = None
    content: str | None = None
    refusal: None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # ToolCall.wire(index)

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> dict[str, Any]:
        data = _Wire._drop_unset(self, handler)
        if self.role is None:
            data.pop("refusal", None)
        return data


class ChatChunkChoice(_Wire):
    index: int
    delta: ChatDelta
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Wire):
    _omit_if_none = frozenset({"usage", "system_fingerprint"})
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


# ----- stream chunks as plain dicts -----
# One chunk per token: built as dicts, not through the models above (validation + model_dump were a
# fifth of the gateway's cost per streamed event). They are the same JSON as the models' dumps, key
# order included; tests/unit/test_stream_chunks.py holds them to it.

def stream_chunk(object_type: str, response_id: str, created: int, model: str, choice: dict[str, Any],
                 usage_null: bool, usage: dict[str, int] | None = None) -> dict[str, Any]:
    """A stream chunk: `object_type` "text_completion" (/v1/completions, `Completion`) or
    "chat.completion.chunk" (`ChatCompletionChunk`); `usage` (continuous usage stats) when given, else
    with `usage_null` (include_usage) usage is null."""
    chunk = {"id": response_id, "object": object_type, "created": created, "model": model, "choices": [choice]}
    if usage is not None:
        chunk["usage"] = usage
    elif usage_null:
        chunk["usage"] = None
    return chunk


def completion_chunk_choice(index: int, text: str, logprobs: CompletionLogprobs | None,
                            finish_reason: str | None) -> dict[str, Any]:
    """`CompletionChoice` of a stream chunk."""
    return {"index": index, "text": text, "logprobs": None if logprobs is None else logprobs.model_dump(),
            "finish_reason": finish_reason}


def chat_chunk_choice(index: int, *, role: str | None = None, content: str | None = None,
                      reasoning: str | None = None, tool_calls: list[dict[str, Any]] | None = None,
                      logprobs: ChatChoiceLogprobs | None = None, finish_reason: str | None = None) -> dict[str, Any]:
    """`ChatChunkChoice`: the delta leaves out role, content, reasoning_content and tool_calls when None, and
    refusal unless role is set, as `ChatDelta` does."""
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if role is not None:
        delta["refusal"] = None
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {"index": index, "delta": delta, "logprobs": None if logprobs is None else logprobs.model_dump(),
            "finish_reason": finish_reason}


# ----- /v1/models -----

class ModelCard(_Wire):
    _omit_if_none = frozenset({"parent", "root", "max_model_len"})
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str | None = None
    parent: str | None = None  # LoRA adapters: the base model's id
    max_model_len: int | None = None


class ModelList(_Wire):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    """OpenAI's error object: `param` names the offending field, `code` is a stable identifier."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error answer of the OpenAI routes: {"error": {...}}."""

    error: ErrorInfo
