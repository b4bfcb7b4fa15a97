"""RequestError and ErrorResponse (real: NVIDIA/TensorRT-LLM tensorrt_llm/executor/utils.py
@ 7b437aaa73bf5a44b1102aee5c631074da763b8f, the version the search index holds; the worker raises RequestError
from _enqueue_request, base_worker.py at the same commit)."""

from __future__ import annotations

from typing import NamedTuple


class RequestError(RuntimeError):
    """A per-request error: the request fails, the executor keeps running."""


class ErrorResponse(NamedTuple):
    client_id: int
    error_msg: str
    request_id: int
