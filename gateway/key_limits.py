"""Optional per-API-key limits: requests in flight (--key-max-concurrency) and tokens per minute
(--key-tokens-per-minute). Over either: 429 with Retry-After in the caller's dialect (RESOURCE_EXHAUSTED
over gRPC). One KeyLimits serves every transport: HTTP through KeyLimitsMiddleware, gRPC's ModelInfer and
each request of a ModelStreamInfer stream through gateway.triton_grpc.

A "key" is the bearer token when it is a configured key (--api-key, --api-keys-file, --admin-api-key);
every other caller (no authentication, or an open route) shares one anonymous budget, so unknown
tokens can neither dodge the limits nor grow the table. Only generation calls count: POST requests
outside the admin routes, and gRPC inference requests. Tokens are a token bucket of `tokens_per_minute`
that refills continuously; a request is admitted while the bucket holds at least one token, and charged
afterwards with the prompt + generated tokens its generations used, however they ended (a disconnect too:
reported by gateway.generation through `charge_tokens`), so concurrent requests may overdraw it and the
debt delays the key's next requests.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth import AuthPolicy, bearer_token
from gateway.errors import (
    KeyConcurrencyLimitError,
    TokenRateLimitError,
    render_for_path,
)
from gateway.middleware import request_id_of
from gateway.settings import Settings


@dataclass
class _Usage:
    tokens: int = 0


# The usage of the request being served: set per request by KeyLimitsMiddleware; the tasks a route
# starts copy the context, so they all add to this one object.
_usage_var: contextvars.ContextVar[_Usage | None] = contextvars.ContextVar("key_usage", default=None)


def charge_tokens(count: int) -> None:
    """Book `count` tokens on the current request's key (no-op outside a rate-limited request)."""
    usage = _usage_var.get()
    if usage is not None:
        usage.tokens += count


class TokenBucket:
    """`per_minute` tokens of capacity, refilled at per_minute / 60 per second; may go negative."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.level = self.capacity
        self._clock = clock
        self._stamp = clock()

    def _refill(self) -> None:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._stamp) * self.rate)
        self._stamp = now

    def retry_after(self) -> int:
        """0 when a request may start now, else whole seconds until the bucket holds one token again."""
        self._refill()
        return 0 if self.level >= 1 else max(1, math.ceil((1 - self.level) / self.rate))

    def charge(self, tokens: int) -> None:
        self._refill()
        self.level -= tokens


@dataclass
class _KeyState:
    in_flight: int = 0
    bucket: TokenBucket | None = None


class KeyLimits:
    """The per-key limits and charges, for every transport: HTTP (KeyLimitsMiddleware) and gRPC
    (gateway.triton_grpc) both admit each generation call through `admit`."""

    def __init__(self, keys: Iterable[bytes], max_concurrency: int | None, tokens_per_minute: int | None) -> None:
        self.max_concurrency = max_concurrency
        self.tokens_per_minute = tokens_per_minute
        self._known = {_digest(k) for k in keys}
        self._states: dict[bytes, _KeyState] = {}

    def _state(self, token: bytes | None) -> _KeyState:
        # Digests, not tokens, are looked up: the lookup's timing says nothing about the keys.
        ident = _digest(token) if token is not None else b""
        ident = ident if ident in self._known else b""
        if ident not in self._states:
            bucket = TokenBucket(self.tokens_per_minute) if self.tokens_per_minute else None
            self._states[ident] = _KeyState(bucket=bucket)
        return self._states[ident]

    def _refusal(self, state: _KeyState) -> Exception | None:
        if self.max_concurrency is not None and state.in_flight >= self.max_concurrency:
            return KeyConcurrencyLimitError(self.max_concurrency)
        wait = state.bucket.retry_after() if state.bucket is not None else 0
        return TokenRateLimitError(self.tokens_per_minute or 0, wait) if wait else None

    def admit(self, token: bytes | None) -> contextlib.AbstractContextManager[None]:
        """The call's lease of one of its key's slots: entered around the call, it charges the key with what
        `charge_tokens` booked meanwhile. Raises KeyConcurrencyLimitError or TokenRateLimitError (429) when the
        key may not start a call now."""
        state = self._state(token)
        error = self._refusal(state)
        if error is not None:
            raise error
        return self._holding(state)

    @contextlib.contextmanager
    def _holding(self, state: _KeyState) -> Iterator[None]:
        state.in_flight += 1
        usage = _Usage()
        reset = _usage_var.set(usage)
        try:
            yield
        finally:
            _usage_var.reset(reset)
            state.in_flight -= 1
            if state.bucket is not None:
                state.bucket.charge(usage.tokens)


def key_limits(settings: Settings, auth: AuthPolicy) -> KeyLimits | None:
    """The per-key limits `settings` ask for; None when neither is set (nothing to pay per request).

    Raises ValueError for a limit below 1 (at start-up, not at the first request)."""
    limits = {"--key-max-concurrency": settings.key_max_concurrency,
              "--key-tokens-per-minute": settings.key_tokens_per_minute}
    for flag, value in limits.items():
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1 (got {value})")
    if all(value is None for value in limits.values()):
        return None
    return KeyLimits(auth.keys + auth.admin_keys, settings.key_max_concurrency, settings.key_tokens_per_minute)


class KeyLimitsMiddleware:
    """Enforces the per-key limits in front of the routes (after authentication): POST requests outside
    `exempt_paths` (the admin routes)."""

    def __init__(self, app: ASGIApp, limits: KeyLimits, exempt_paths: Iterable[str] = ()) -> None:
        self.app = app
        self.limits = limits
        self.exempt_paths = frozenset(exempt_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] in self.exempt_paths:
            await self.app(scope, receive, send)
            return
        try:
            lease = self.limits.admit(bearer_token(scope["headers"]))
        except (KeyConcurrencyLimitError, TokenRateLimitError) as error:
            await render_for_path(scope["path"], error, request_id_of(scope))(scope, receive, send)
            return
        with lease:
            await self.app(scope, receive, send)


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


__all__ = ["KeyLimits", "KeyLimitsMiddleware", "TokenBucket", "charge_tokens", "key_limits"]
