"""Per-request size limits of the OpenAI endpoints (n, stop strings, logit_bias, messages, prompts).

Checked after schema validation, so a request over a limit gets a 400 naming the field, in the
same shape as any other invalid field. The numbers come from the server's settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.openai.requests import ChatCompletionRequest, CompletionRequest, SamplingFields
from runtime.errors import InvalidRequestError


@dataclass(frozen=True)
class RequestLimits:
    """Upper bounds on one request's fields."""

    max_n: int = 16
    max_stop_strings: int = 16
    max_stop_string_length: int = 256
    max_logit_bias: int = 300
    max_messages: int = 1024
    max_prompts: int = 256


def _over(param: str, what: str, got: int, limit: int) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid value for '{param}': {what} {got}, over this server's limit of {limit}.",
                               param=param)


def check_limits(req: SamplingFields, limits: RequestLimits) -> None:
    """Raise InvalidRequestError (400, naming the field) when `req` is over any limit."""
    if req.n > limits.max_n:
        raise _over("n", "got n =", req.n, limits.max_n)
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > limits.max_stop_strings:
        raise _over("stop", "number of stop strings", len(stops), limits.max_stop_strings)
    longest = max((len(s) for s in stops), default=0)
    if longest > limits.max_stop_string_length:
        raise _over("stop", "a stop string of length", longest, limits.max_stop_string_length)
    if req.logit_bias and len(req.logit_bias) > limits.max_logit_bias:
        raise _over("logit_bias", "number of entries", len(req.logit_bias), limits.max_logit_bias)
    if isinstance(req, ChatCompletionRequest) and len(req.messages) > limits.max_messages:
        raise _over("messages", "number of messages", len(req.messages), limits.max_messages)
    if isinstance(req, CompletionRequest) and len(req.prompts()) > limits.max_prompts:
        raise _over("prompt", "number of prompts", len(req.prompts()), limits.max_prompts)
