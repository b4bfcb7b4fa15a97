"""The Responses API's wire objects: the response, its output items, usage, and the stream events.

Shaped like OpenAI's (the openai SDK's `openai.types.responses` models parse them). Events are built as
dicts by adapters/openai/responses_output.py (one per token, as chat chunks are); the event models here
document them in /openapi.json and hold the dicts to their shape in tests/unit/test_responses_api.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, RootModel

from runtime.request import Usage

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class OutputMessage(BaseModel):
    """The assistant's text, one output_text part."""

    id: str
    type: Literal["message"] = "message"
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionToolCall(BaseModel):
    """A call of a function tool: `call_id` pairs it with the function_call_output sent back."""

    id: str
    type: Literal["function_call"] = "function_call"
    status: ItemStatus
    call_id: str
    name: str
    arguments: str  # JSON


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(BaseModel):
    """The model's reasoning (gpt-oss's analysis channel, Qwen3's `<think>`), one reasoning_text part."""

    id: str
    type: Literal["reasoning"] = "reasoning"
    status: ItemStatus
    summary: list[Any] = []
    content: list[ReasoningText]


OutputItem = OutputMessage | FunctionToolCall | ReasoningItem


class InputTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens whose KV blocks the prefix cache held
    cache_write_tokens: int = 0  # OpenAI's explicit cache breakpoints: none here (the SDK requires the field)


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0  # not counted: reasoning is split from the answer as text, not by token


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int

    @classmethod
    def of(cls, usage: Usage) -> ResponseUsage:
        return cls(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                   total_tokens=usage.total_tokens,
                   input_tokens_details=InputTokensDetails(cached_tokens=usage.cached_tokens),
                   output_tokens_details=OutputTokensDetails())


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: str  # "server_error"
    message: str


class Reasoning(BaseModel):
    effort: None = None
    summary: None = None


class ResponseObject(BaseModel):
    """The response: what POST returns, GET returns, and the lifecycle events carry."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    completed_at: int | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    prompt_cache_key: str | None
    reasoning: Reasoning = Reasoning()
    safety_identifier: str | None
    store: bool
    temperature: float
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_p: float
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None
    metadata: dict[str, str]
    background: bool = False


class ResponseDeleted(BaseModel):
    """DELETE /v1/responses/{response_id}."""

    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: Literal[True] = True


# ----- stream events: every one has `type` and `sequence_number` (0, 1, ...) -----

class LifecycleEvent(BaseModel):
    type: Literal["response.created", "response.in_progress", "response.completed", "response.incomplete",
                  "response.failed"]
    sequence_number: int
    response: ResponseObject


class OutputItemEvent(BaseModel):
    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    output_index: int
    item: OutputItem


class ContentPartEvent(BaseModel):
    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText


class ReasoningDeltaEvent(BaseModel):
    type: Literal["response.reasoning_text.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningDoneEvent(BaseModel):
    type: Literal["response.reasoning_text.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str


class TextDeltaEvent(BaseModel):
    type: Literal["response.output_text.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any]


class TextDoneEvent(BaseModel):
    type: Literal["response.output_text.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any]


class ArgumentsDeltaEvent(BaseModel):
    type: Literal["response.function_call_arguments.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(BaseModel):
    type: Literal["response.function_call_arguments.done"]
    sequence_number: int
    item_id: str
    output_index: int
    arguments: str


class ErrorEvent(BaseModel):
    """A failure after the stream began (OpenAI's error object, flattened); response.failed follows."""

    type: Literal["error"]
    sequence_number: int
    code: str | None
    message: str
    param: str | None


class ResponseStreamEvent(RootModel[LifecycleEvent | OutputItemEvent | ContentPartEvent | TextDeltaEvent
                                    | TextDoneEvent | ArgumentsDeltaEvent | ArgumentsDoneEvent | ReasoningDeltaEvent
                                    | ReasoningDoneEvent | ErrorEvent]):
    """Any event of a streamed response."""


__all__ = ["FunctionToolCall", "OutputMessage", "OutputText", "ReasoningItem", "ReasoningText", "ResponseDeleted", "ResponseObject",
           "ResponseStreamEvent", "ResponseUsage"]
