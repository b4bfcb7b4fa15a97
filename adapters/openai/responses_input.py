"""Responses API input -> the chat path: input items become chat messages, the request a chat request.

A response is generated exactly as the equivalent chat completion is (same template, sampling options
and grammar), so the same messages give the same tokens on both routes. The conversation is the earlier
response's (previous_response_id: its input and output items), then this request's `input`; the
`instructions` go first as a system message and are not carried over to later responses, as OpenAI does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from adapters.openai.requests import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    SamplingFields,
    ToolCallFunctionParam,
    ToolCallParam,
)
from adapters.openai.responses_request import InputItem, ResponsesRequest, TextPart
from adapters.openai.translate import chat_request
from runtime.errors import InvalidRequestError
from runtime.request import GenerationRequest
from runtime.tokenizer import Tokenizer

# SamplingFields the chat request takes over as they are (stream_options differs between the APIs)
_SAMPLING = [name for name in SamplingFields.model_fields if name != "stream_options"]


def _content(content: str | list[TextPart] | None) -> str | list[ContentPart] | None:
    if content is None or isinstance(content, str):
        return content
    return [ContentPart(type="text", text=part.value) for part in content]


def conversation_messages(instructions: str | None, items: Sequence[InputItem]) -> list[ChatMessage]:
    """The conversation as chat messages: function calls join the assistant turn before them (the text
    they followed, or the calls made with them), outputs become `tool` messages, a reasoning item becomes the
    `reasoning_content` of the assistant turn after it (as chat clients send it back)."""
    messages = [] if instructions is None else [ChatMessage(role="system", content=instructions)]
    reasoning: str | None = None
    for item in items:
        if item.type == "reasoning":
            reasoning = "".join(part.value for part in item.content or [] if not isinstance(part, str))
            continue
        if item.type == "message":
            messages.append(ChatMessage(role=item.role, content=_content(item.content)))
        elif item.type == "function_call":
            call = ToolCallParam(id=item.call_id, type="function",
                                 function=ToolCallFunctionParam(name=item.name, arguments=item.arguments))
            if messages and messages[-1].role == "assistant" and reasoning is None:
                messages[-1].tool_calls = [*(messages[-1].tool_calls or []), call]
            else:
                messages.append(ChatMessage(role="assistant", tool_calls=[call]))
        else:
            messages.append(ChatMessage(role="tool", tool_call_id=item.call_id, content=_content(item.output)))
        if reasoning is not None and messages[-1].role == "assistant":
            setattr(messages[-1], "reasoning_content", reasoning)
        reasoning = None
    return messages


def chat_completion_request(req: ResponsesRequest, items: Sequence[InputItem]) -> ChatCompletionRequest:
    """The chat request equivalent to `req` over the conversation `items`; 400 when they hold no message (only
    reasoning items, say)."""
    messages = conversation_messages(req.instructions, items)
    if not messages:
        raise InvalidRequestError("'input' has no message, function call or function call output to answer "
                                  "(reasoning items alone are not a conversation)", param="input")
    return ChatCompletionRequest(
        **{name: getattr(req, name) for name in _SAMPLING},
        messages=messages,
        max_completion_tokens=req.max_output_tokens,
        tools=req.chat_tools(),
        tool_choice=req.chat_tool_choice(),
        response_format=req.response_format(),
        parallel_tool_calls=req.parallel_tool_calls,
    )


def responses_request(req: ResponsesRequest, items: Sequence[InputItem], response_id: str, tokenizer: Tokenizer,
                      adapter: str | None = None) -> GenerationRequest:
    """The engine request of a response: chat's, with grammar errors naming `text.format`."""
    out = chat_request(chat_completion_request(req, items), response_id, tokenizer, adapter)
    if out.guided is not None and out.guided.param == "response_format":
        out.guided = replace(out.guided, param="text.format")
    return out


def output_items(output: list[dict[str, Any]]) -> list[InputItem]:
    """A response's output items (messages, function calls) as input items of a later response."""
    return [InputItem.model_validate(item) for item in output]
