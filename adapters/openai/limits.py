"""The OpenAI endpoints' per-request size limits (n, stop strings, logit_bias, messages, prompts).

Checked after schema validation, so a request over a limit gets a 400 naming the field, in the
same shape as any other invalid field. The numbers come from the server's settings.
"""

from __future__ import annotations

from adapters.limits import RequestLimits, check_words, over_limit
from adapters.openai.requests import ChatCompletionRequest, CompletionRequest, SamplingFields


def check_limits(req: SamplingFields, limits: RequestLimits) -> None:
    """Raise InvalidRequestError (400, naming the field) when `req` is over any limit."""
    if req.n > limits.max_n:
        raise over_limit("n", "got n =", req.n, limits.max_n)
    if isinstance(req, CompletionRequest) and req.samples > limits.max_n:  # best_of: samples generated, as n
        raise over_limit("best_of", "got best_of =", req.samples, limits.max_n)
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    check_words("stop", stops, limits.max_stop_strings, limits.max_stop_string_length, noun="stop strings")
    if req.logit_bias and len(req.logit_bias) > limits.max_logit_bias:
        raise over_limit("logit_bias", "number of entries", len(req.logit_bias), limits.max_logit_bias)
    if isinstance(req, ChatCompletionRequest) and len(req.messages) > limits.max_messages:
        raise over_limit("messages", "number of messages", len(req.messages), limits.max_messages)
    if isinstance(req, CompletionRequest) and len(req.prompts()) > limits.max_prompts:
        raise over_limit("prompt", "number of prompts", len(req.prompts()), limits.max_prompts)
