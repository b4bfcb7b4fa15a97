"""The ONE table from error classes to HTTP status, and its rendering in both dialects.

OpenAI dialect: `{"error": {"message", "type", "param", "code"}}` with the `type`/`code` values the
OpenAI API itself returns for the same situation. Triton dialect: `{"error": "<message>"}`.
Every route (OpenAI and Triton) turns exceptions into responses only through this module.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from runtime.errors import (
    EngineError,
    EngineFailedError,
    EngineNotReadyError,
    InvalidRequestError,
    PromptTooLongError,
    QueueFullError,
    UnknownAdapterError,
    UnsupportedOptionError,
    brief,
)

log = logging.getLogger("gateway.errors")


class ModelNotFoundError(EngineError):
    """The request names a model that is neither the served model nor a loaded adapter."""

    def __init__(self, model: str, param: str | None = None) -> None:
        super().__init__(f"The model `{model}` does not exist.")
        self.model = model
        self.param = param  # "model" where the name is the subject (GET /v1/models/{model}), as OpenAI sends it


class ResponseNotFoundError(EngineError):
    """No stored response has this id (never stored, `store: false`, deleted, expired or dropped for room)."""

    def __init__(self, response_id: str, param: str | None = None) -> None:
        super().__init__(f"Response with id '{response_id}' not found.")
        self.param = param  # "previous_response_id" when a new response names it


class AuthenticationError(EngineError):
    """Missing or wrong API key."""


class PermissionDeniedError(EngineError):
    """A valid key that may not call this route (admin routes with --admin-api-key)."""


class BodyTooLargeError(InvalidRequestError):
    """The request body is over --max-body-bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"The request body is larger than the server's limit of {limit} bytes (--max-body-bytes).")
        self.limit = limit


class BodyReadTimeoutError(InvalidRequestError):
    """The client sent nothing for --read-timeout seconds while sending its request body."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"The request body did not arrive: nothing came for {timeout:g} s (--read-timeout).")


class RouteNotFoundError(InvalidRequestError):
    """No route at this path (OpenAI answers 404 "Invalid URL")."""


class MethodNotAllowedError(InvalidRequestError):
    """The route exists, but not for this HTTP method."""


class RequestTimeoutError(EngineError):
    """The request ran past --request-timeout and was aborted."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"The request did not finish within the server's request timeout of {timeout:g} s "
                         "(--request-timeout) and was aborted.")
        self.timeout = timeout


class KeyConcurrencyLimitError(QueueFullError):
    """The caller's API key already has --key-max-concurrency requests in flight."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"Rate limit reached: your API key already has {limit} requests in flight, this "
                         "server's limit per key (--key-max-concurrency). Retry when one finishes.")


class TokenRateLimitError(QueueFullError):
    """The caller's API key used up its --key-tokens-per-minute; `retry_after` seconds until it may go on."""

    def __init__(self, per_minute: int, retry_after: int) -> None:
        super().__init__(f"Rate limit reached for tokens: your API key may use {per_minute} tokens per minute "
                         f"(--key-tokens-per-minute). Please try again in {retry_after}s.")
        self.retry_after = retry_after


class ServerDrainingError(EngineNotReadyError):
    """The server got SIGTERM and finishes in-flight requests only."""

    def __init__(self, message: str = "The server is shutting down and takes no new requests; retry on another "
                 "replica.") -> None:
        super().__init__(message)


class ClientDisconnected(Exception):
    """The client went away before the response was ready (answered 499 for the logs and metrics only)."""


@dataclass(frozen=True)
class ErrorKind:
    """How one error class looks on the wire."""

    status: int
    type: str  # OpenAI error "type"
    code: str | None  # OpenAI error "code"


# Most specific classes first: lookup walks the exception's MRO, so subclasses win over bases.
ERROR_TABLE: dict[type[BaseException], ErrorKind] = {
    PromptTooLongError: ErrorKind(400, "invalid_request_error", "context_length_exceeded"),
    BodyTooLargeError: ErrorKind(413, "invalid_request_error", "request_too_large"),
    BodyReadTimeoutError: ErrorKind(408, "invalid_request_error", "request_timeout"),
    UnsupportedOptionError: ErrorKind(400, "invalid_request_error", "unsupported_parameter"),
    RouteNotFoundError: ErrorKind(404, "invalid_request_error", None),
    MethodNotAllowedError: ErrorKind(405, "invalid_request_error", None),
    InvalidRequestError: ErrorKind(400, "invalid_request_error", None),
    AuthenticationError: ErrorKind(401, "invalid_request_error", "invalid_api_key"),
    PermissionDeniedError: ErrorKind(403, "invalid_request_error", "insufficient_permissions"),
    ModelNotFoundError: ErrorKind(404, "invalid_request_error", "model_not_found"),
    UnknownAdapterError: ErrorKind(404, "invalid_request_error", "model_not_found"),
    ResponseNotFoundError: ErrorKind(404, "invalid_request_error", None),
    # OpenAI answers rate limits with type "requests" (or "tokens") and code "rate_limit_exceeded".
    TokenRateLimitError: ErrorKind(429, "tokens", "rate_limit_exceeded"),
    QueueFullError: ErrorKind(429, "requests", "rate_limit_exceeded"),
    EngineNotReadyError: ErrorKind(503, "server_error", "service_unavailable"),
    EngineFailedError: ErrorKind(500, "server_error", None),
    RequestTimeoutError: ErrorKind(504, "server_error", "timeout"),
    # nginx's "client closed request": counted and logged, never seen by the (gone) client.
    ClientDisconnected: ErrorKind(499, "invalid_request_error", "client_closed_request"),
}
# Seconds a client should wait before retrying a 429 or 503 (the queue drains in about a step or two).
RETRY_AFTER_S = 1
_INTERNAL = ErrorKind(500, "server_error", None)


def error_kind(exc: BaseException) -> ErrorKind:
    """The table row for `exc` (unknown exceptions are internal errors: 500)."""
    for cls in type(exc).__mro__:
        kind = ERROR_TABLE.get(cls)
        if kind is not None:
            return kind
    return _INTERNAL


def error_message(exc: BaseException, request_id: str | None = None) -> str:
    """The user-facing message. Server errors carry the request id so logs can be matched."""
    kind = error_kind(exc)
    if kind.status >= 500 and kind.status != 503:
        detail = exc.message if isinstance(exc, EngineError) else "internal error"
        return f"The server had an error while processing your request: {detail} (request id: {request_id})"
    if isinstance(exc, EngineError):
        return exc.message
    return str(exc)


def log_error(exc: BaseException, request_id: str | None) -> None:
    """Log a rejection at INFO, a server error with its traceback at ERROR."""
    kind = error_kind(exc)
    if kind.status >= 500 and kind.status != 503:
        log.error("request %s failed", request_id, exc_info=exc)
    else:
        log.info("request %s rejected with %d: %s", request_id, kind.status, brief(exc))


def openai_error_body(exc: BaseException, request_id: str | None = None) -> dict[str, Any]:
    """OpenAI's error object, e.g. {"error": {"message": ..., "type": "invalid_request_error", ...}}."""
    kind = error_kind(exc)
    code = getattr(exc, "code", None)  # some 400s name OpenAI's own code (adapters.openai.validation)
    return {
        "error": {
            "message": error_message(exc, request_id),
            "type": kind.type,
            "param": getattr(exc, "param", None),
            "code": code if isinstance(code, str) else kind.code,
        }
    }


def triton_error_body(exc: BaseException, request_id: str | None = None) -> dict[str, Any]:
    """Triton's error object: {"error": "<message>"}."""
    return {"error": error_message(exc, request_id)}


def _headers(exc: BaseException, request_id: str | None) -> dict[str, str]:
    headers = {"x-request-id": request_id} if request_id else {}
    if error_kind(exc).status in (429, 503):
        headers["retry-after"] = str(getattr(exc, "retry_after", RETRY_AFTER_S))
    return headers


def openai_error_response(exc: BaseException, request_id: str | None = None) -> JSONResponse:
    """A JSON response with the table's status and OpenAI's error object (logs server errors)."""
    log_error(exc, request_id)
    return JSONResponse(openai_error_body(exc, request_id), error_kind(exc).status, _headers(exc, request_id))


def triton_error_response(exc: BaseException, request_id: str | None = None) -> JSONResponse:
    """A JSON response with the table's status and Triton's error object (logs server errors)."""
    log_error(exc, request_id)
    return JSONResponse(triton_error_body(exc, request_id), error_kind(exc).status, _headers(exc, request_id))


def render_for_path(path: str, exc: BaseException, request_id: str | None = None) -> JSONResponse:
    """The error in the dialect of `path`: Triton's shape under /v2, OpenAI's everywhere else."""
    render = triton_error_response if path.startswith("/v2") else openai_error_response
    return render(exc, request_id)
