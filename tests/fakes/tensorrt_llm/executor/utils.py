"""RequestError and ErrorResponse (real: NVIDIA/TensorRT-LLM tensorrt_llm/executor/utils.py; the worker raises
RequestError from _enqueue_request, base_worker.py stored-file id 1131391427 of the search index)."""

from __future__ import annotations

from typing import NamedTuple


class RequestError(RuntimeError):
    """A per-request error: the request fails, the executor keeps running."""


class ErrorResponse(NamedTuple):
    client_id: int
    error_msg: str
    request_id: int
