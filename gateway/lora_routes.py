"""LoRA adapters at run time, with vLLM's routes and bodies:

    POST /v1/load_lora_adapter    {"lora_name": "sql", "lora_path": "/adapters/sql"}
    POST /v1/unload_lora_adapter  {"lora_name": "sql"}

Off unless the server runs with --enable-lora-loading (as vLLM needs VLLM_ALLOW_RUNTIME_LORA_UPDATING);
then 404. Paths must lie inside one of the --lora-root folders (relative paths are taken from there; without
any, $XDG_CACHE_HOME/trtllm-gateway/lora), so clients cannot make the server read arbitrary folders. Errors
name a path as the client gave it, never as it resolved (a symbolic link's target, the root's absolute
place), and a path outside the roots gets the same answer whether it exists or not. API keys (--api-keys)
guard these routes like every other. Success answers are vLLM's plain-text lines.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from adapters.triton import IDS_MODEL_NAME, TEXT_MODEL_NAMES
from gateway.errors import openai_error_response
from gateway.middleware import request_id_of
from gateway.openai_routes import read_json, ready_engine
from runtime.cache import cache_folder
from runtime.errors import EngineError, InvalidRequestError

log = logging.getLogger("gateway.lora")


def _field(body: Any, name: str) -> str:
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    value = body.get(name)
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequestError(f"'{name}' must be a non-empty string", param=name)
    return value.strip()


def check_adapter_names(names: Iterable[str], served_model_name: str, source: str = "lora_name") -> None:
    """InvalidRequestError (400; a start-up error for --lora-modules) for a name that already means a model:
    requests naming it reach that model (OpenAI's `model`, Triton's path), never the adapter."""
    taken = [served_model_name, *TEXT_MODEL_NAMES, IDS_MODEL_NAME]
    for name in names:
        if name in taken:
            raise InvalidRequestError(
                f"{source}: the adapter name '{name}' is already a model name of this server (the served model "
                f"'{served_model_name}' and the Triton models {', '.join(taken[1:])}); choose another name",
                param="lora_name")


def lora_roots(configured: list[str]) -> list[str]:
    """The folders run-time adapters load from: --lora-root, else the cache's `lora` folder (made now, so that
    there is a place to put them)."""
    if configured:
        return configured
    default = cache_folder("lora")
    try:
        default.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("cannot make the default LoRA root %s (%s); set --lora-root", default, exc.strerror or exc)
    return [str(default)]


def allowed_path(path: str, roots: list[str]) -> str:
    """The real folder `path` names, checked to be inside one of `roots`."""
    if "\0" in path:  # no file system takes it (os.path would raise ValueError: a 500)
        raise InvalidRequestError("lora_path must not contain a NUL character", param="lora_path")
    real_roots = [os.path.realpath(r) for r in roots]
    candidates = [path] if os.path.isabs(path) else [os.path.join(r, path) for r in real_roots]
    for candidate in candidates:
        real = os.path.realpath(candidate)
        if any(os.path.commonpath([real, root]) == root for root in real_roots) and os.path.isdir(real):
            return real
    raise InvalidRequestError(
        f"lora_path '{path}' is not a folder inside the allowed LoRA roots (--lora-root)", param="lora_path")


def _as_given(exc: EngineError, real: str, given: str) -> EngineError:
    """`exc` naming the adapter's folder (and files in it) as the client named it, not as it resolved."""
    exc.message = exc.message.replace(real, given.rstrip("/") or given)
    exc.args = (exc.message,)
    return exc


def _disabled(request: Request) -> Response | None:
    if request.app.state.settings.enable_lora_loading:
        return None
    exc = InvalidRequestError("Loading and unloading LoRA adapters at run time is disabled; start the server "
                              "with --enable-lora-loading to allow it.")
    response = openai_error_response(exc, request_id_of(request.scope))
    response.status_code = 404
    return response


async def load_lora_adapter(request: Request) -> Response:
    if (off := _disabled(request)) is not None:
        return off
    try:
        body = await read_json(request)
        name, path = _field(body, "lora_name"), _field(body, "lora_path")
        engine = ready_engine(request)
        check_adapter_names([name], engine.model_info.name)
        real = allowed_path(path, lora_roots(request.app.state.settings.lora_root))
        try:
            await engine.load_lora_adapter(name, real)
        except EngineError as exc:
            raise _as_given(exc, real, path) from None
    except Exception as exc:
        return openai_error_response(exc, request_id_of(request.scope))
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: Request) -> Response:
    if (off := _disabled(request)) is not None:
        return off
    try:
        name = _field(await read_json(request), "lora_name")
        await ready_engine(request).unload_lora_adapter(name)
    except Exception as exc:
        return openai_error_response(exc, request_id_of(request.scope))
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def lora_routes() -> list[BaseRoute]:
    return [
        Route("/v1/load_lora_adapter", load_lora_adapter, methods=["POST"]),
        Route("/v1/unload_lora_adapter", unload_lora_adapter, methods=["POST"]),
    ]


__all__ = ["allowed_path", "check_adapter_names", "lora_roots", "lora_routes"]
