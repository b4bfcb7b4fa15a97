"""gateway.auth.AuthPolicy and gateway.limits helpers (the HTTP behaviour is in tests/e2e/test_security.py)."""

from __future__ import annotations

import hmac
from pathlib import Path

import pytest

from gateway import auth as auth_module
from gateway.auth import AuthPolicy, bearer_token, load_api_keys
from gateway.errors import AuthenticationError, PermissionDeniedError
from gateway.limits import json_depth, parse_json
from gateway.settings import Settings
from runtime.errors import InvalidRequestError


def policy(**settings) -> AuthPolicy:
    return AuthPolicy.from_settings(Settings(**settings), admin_paths=["/v1/load_lora_adapter"])


def test_every_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth_module.hmac, "compare_digest", spy)
    p = policy(api_key=["first", "second", "third"])
    assert p.check("/v1/models", b"first") is None
    assert len(calls) == 3  # no early exit on the match: timing does not tell which key matched


def test_public_paths_and_prefixes() -> None:
    p = policy(api_key=["k"], public_paths=["/health", "/metrics"])
    assert p.check("/health", None) is None and p.check("/metrics", None) is None
    assert p.check("/health/live", None) is None
    assert isinstance(p.check("/healthz", None), AuthenticationError)
    assert isinstance(policy(api_key=["k"], public_paths=["/health"]).check("/metrics", None), AuthenticationError)


def test_probes_and_metrics_are_public_by_default_and_the_rest_is_not() -> None:
    p = policy(api_key=["k"])  # Kubernetes probes carry no key: Triton's liveness and readiness are open too
    for path in ("/health", "/metrics", "/v2/health/live", "/v2/health/ready"):
        assert p.check(path, None) is None, path
    for path in ("/v2", "/v2/models/tiny/ready", "/v2/models/tiny/generate"):
        assert isinstance(p.check(path, None), AuthenticationError), path


def test_no_keys_means_open_and_admin_key_alone_guards_admin_routes_only() -> None:
    assert policy().check("/v1/load_lora_adapter", None) is None
    p = policy(admin_api_key=["adm"])
    assert p.check("/v1/models", None) is None
    assert isinstance(p.check("/v1/load_lora_adapter", None), AuthenticationError)
    assert p.check("/v1/load_lora_adapter", b"adm") is None


def test_a_user_key_on_an_admin_route_is_403() -> None:
    p = policy(api_key=["user"], admin_api_key=["adm"])
    assert isinstance(p.check("/v1/load_lora_adapter", b"user"), PermissionDeniedError)
    assert p.check("/v1/models", b"adm") is None  # the admin key works everywhere
    assert p.is_admin(b"adm") and not p.is_admin(b"user") and not p.is_admin(None)


def test_keys_file(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("# comment\n\n  file-key  \nother\n")
    assert load_api_keys(Settings(api_key=["flag-key"], api_keys_file=str(f))) == ["flag-key", "file-key", "other"]


def test_bearer_token_parsing() -> None:
    assert bearer_token([(b"authorization", b"Bearer abc")]) == b"abc"
    assert bearer_token([(b"authorization", b"bearer  abc ")]) == b"abc"
    assert bearer_token([(b"authorization", b"Basic abc")]) is None
    assert bearer_token([(b"authorization", b"Bearer ")]) is None
    assert bearer_token([]) is None


def test_json_depth_and_parse_limits() -> None:
    assert json_depth(1) == 0 and json_depth([]) == 1 and json_depth({"a": [1, {"b": []}]}) == 4
    assert parse_json(b'{"a": [[1]]}', max_depth=3) == {"a": [[1]]}
    with pytest.raises(InvalidRequestError, match="nested more than 2"):
        parse_json(b'{"a": [[1]]}', max_depth=2)
    with pytest.raises(InvalidRequestError, match="nested more than"):
        parse_json(b"[" * 100_000 + b"]" * 100_000, max_depth=32)
    with pytest.raises(InvalidRequestError, match="could not parse"):
        parse_json(b"{nope", max_depth=32)


def test_require_admin_helper_for_route_handlers() -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from gateway.auth import require_admin

    async def mutate(request):  # a handler that decides per call, as an admin route may
        try:
            require_admin(request)
        except PermissionDeniedError as exc:
            return PlainTextResponse(exc.message, status_code=403)
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/x", mutate, methods=["POST"])])
    app.state.auth = policy(api_key=["user"], admin_api_key=["adm"])
    with TestClient(app) as c:
        assert c.post("/x", headers={"authorization": "Bearer adm"}).text == "ok"
        assert c.post("/x", headers={"authorization": "Bearer user"}).status_code == 403
        assert c.post("/x").status_code == 403
