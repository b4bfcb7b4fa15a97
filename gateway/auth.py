"""API-key authentication: `Authorization: Bearer <key>` on every route except the public ones.

Keys come from --api-key (repeatable) and --api-keys-file; admin routes (LoRA loading) take a
separate --admin-api-key when one is configured. Keys are compared in constant time and never
logged. A rejection is a 401 (403 for a valid key on an admin route) in the caller's dialect:
OpenAI's error object on /v1, Triton's {"error": ...} on /v2.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import AuthenticationError, PermissionDeniedError, render_for_path
from gateway.middleware import request_id_of
from gateway.settings import Settings


def load_api_keys(settings: Settings) -> list[str]:
    """--api-key values plus the lines of --api-keys-file (blank lines and # comments skipped)."""
    keys = [k.strip() for k in settings.api_key if k.strip()]
    if settings.api_keys_file:
        try:
            text = Path(settings.api_keys_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"--api-keys-file {settings.api_keys_file}: {exc.strerror or exc}") from None
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
    return keys


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header; None when absent or another scheme."""
    auth = dict(headers).get(b"authorization")
    if auth is None:
        return None
    scheme, _, token = auth.partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" and token.strip() else None


def _matches(token: bytes, keys: list[bytes]) -> bool:
    # Compare with every key, without stopping at a match: the time taken tells nothing about which.
    found = False
    for key in keys:
        found |= hmac.compare_digest(token, key)
    return found


@dataclass(frozen=True)
class AuthPolicy:
    """Who may call what. No keys at all: everything is open."""

    keys: list[bytes]
    admin_keys: list[bytes]
    public_paths: tuple[str, ...]
    admin_paths: frozenset[str]

    @classmethod
    def from_settings(cls, settings: Settings, admin_paths: Iterable[str] = ()) -> AuthPolicy:
        return cls(keys=[k.encode() for k in load_api_keys(settings)],
                   admin_keys=[k.encode() for k in settings.admin_api_key if k],
                   public_paths=tuple(settings.public_paths), admin_paths=frozenset(admin_paths))

    def is_public(self, path: str) -> bool:
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in self.public_paths)

    def is_admin(self, token: bytes | None) -> bool:
        """True when `token` may call admin routes (any caller, when no key of either kind is set)."""
        if self.admin_keys:
            return token is not None and _matches(token, self.admin_keys)
        return not self.keys or (token is not None and _matches(token, self.keys))

    def identity(self, token: bytes | None) -> bytes:
        """Who the caller is, for what is scoped per caller (Triton stop signals): a digest of its key when it is
        a configured one, else b"" (every caller without one is the same anonymous caller)."""
        if token is None or not _matches(token, self.keys + self.admin_keys):
            return b""
        return hashlib.sha256(token).digest()

    def check(self, path: str, token: bytes | None) -> Exception | None:
        """None when the call is allowed, else the error to answer with."""
        if self.is_public(path):
            return None
        if path in self.admin_paths and self.admin_keys:
            if token is not None and _matches(token, self.admin_keys):
                return None
            if token is not None and _matches(token, self.keys):
                return PermissionDeniedError("This route needs the admin API key (--admin-api-key).")
            return _unauthenticated(token)
        if not self.keys and not self.admin_keys:
            return None
        if token is not None and _matches(token, self.keys + self.admin_keys):
            return None
        if not self.keys:  # only admin keys configured: ordinary routes stay open
            return None
        return _unauthenticated(token)


def _unauthenticated(token: bytes | None) -> AuthenticationError:
    if token is None:
        return AuthenticationError("You didn't provide an API key. You need to provide your API key in an "
                                   "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
    return AuthenticationError("Incorrect API key provided.")  # never echo the key back


def require_admin(request: Request) -> None:
    """For admin route handlers: raise PermissionDeniedError unless the caller holds an admin key.

    Routes listed as admin paths in create_app are already checked by the middleware; this is for
    handlers that decide per call (e.g. a read-only vs. a mutating method on one path).
    """
    policy: AuthPolicy = request.app.state.auth
    if not policy.is_admin(bearer_token(request.scope["headers"])):
        raise PermissionDeniedError("This route needs the admin API key (--admin-api-key).")


class ApiKeyMiddleware:
    """Pure-ASGI auth gate in front of every route (see AuthPolicy)."""

    def __init__(self, app: ASGIApp, policy: AuthPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        error = self.policy.check(scope["path"], bearer_token(scope["headers"]))
        if error is None:
            await self.app(scope, receive, send)
            return
        response = render_for_path(scope["path"], error, request_id_of(scope))
        if isinstance(error, AuthenticationError):
            response.headers["www-authenticate"] = "Bearer"
        await response(scope, receive, send)
