"""The OpenAI dialect: request schemas, translation to runtime requests, responses and chunks."""

from adapters.openai.chat import ChatOutput
from adapters.openai.completions import CompletionOutput
from adapters.openai.requests import ChatCompletionRequest, ChatMessage, CompletionRequest, UnsupportedFieldError
from adapters.openai.responses import ModelCard, ModelList
from adapters.openai.translate import chat_request, completion_requests, sampling_options
from adapters.openai.validation import parse_request

__all__ = [
    "ChatCompletionRequest", "ChatMessage", "ChatOutput", "CompletionOutput", "CompletionRequest",
    "ModelCard", "ModelList", "UnsupportedFieldError", "chat_request", "completion_requests",
    "parse_request", "sampling_options",
]
