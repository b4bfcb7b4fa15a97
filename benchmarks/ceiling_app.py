"""The stack's ceiling: a minimal Starlette app that answers POST /v1/completions like the gateway
(the same number of SSE events, OpenAI-shaped JSON chunks serialised per event, a usage chunk and
[DONE]) with no engine, tokenizer or validation behind it. The gateway-overhead benchmark compares
the gateway against it on the same uvicorn.

    python -m uvicorn benchmarks.ceiling_app:app --port 8001 --no-access-log

Two variants of the same endpoint:
  /v1/completions      Starlette StreamingResponse with hand-written SSE frames (the raw ceiling)
  /sse/v1/completions  sse-starlette's EventSourceResponse (what the gateway builds on)
BENCH_CEILING_STEP_DELAY (seconds, default 0) sleeps before each event, to mimic a paced engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

STEP_DELAY = float(os.environ.get("BENCH_CEILING_STEP_DELAY", "0"))
_WORDS = [" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", " and", " runs"]


def _chunk(cid: str, created: int, model: str, text: str, finish: str | None) -> dict:
    return {
        "id": cid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}],
    }


async def _payloads(body: dict) -> AsyncIterator[str]:
    """The JSON payloads of one streamed completion, serialised one by one as the gateway does."""
    n = int(body.get("max_tokens") or 16)
    cid, created, model = f"cmpl-{uuid.uuid4().hex}", int(time.time()), str(body.get("model", "ceiling"))
    prompt_tokens = len(str(body.get("prompt", "")).split())
    for i in range(n):
        if STEP_DELAY:
            await asyncio.sleep(STEP_DELAY)
        yield json.dumps(_chunk(cid, created, model, _WORDS[i % len(_WORDS)], "length" if i == n - 1 else None))
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        yield json.dumps({"id": cid, "object": "text_completion", "created": created, "model": model, "choices": [], "usage": usage})
    yield "[DONE]"


async def _raw_frames(body: dict) -> AsyncIterator[bytes]:
    async for payload in _payloads(body):
        yield f"data: {payload}\n\n".encode()


async def completions(request: Request) -> Response:
    body = await request.json()
    if body.get("stream"):
        return StreamingResponse(_raw_frames(body), media_type="text/event-stream")
    n = int(body.get("max_tokens") or 16)
    if STEP_DELAY:
        await asyncio.sleep(STEP_DELAY * n)
    text = "".join(_WORDS[i % len(_WORDS)] for i in range(n))
    prompt_tokens = len(str(body.get("prompt", "")).split())
    out = _chunk(f"cmpl-{uuid.uuid4().hex}", int(time.time()), str(body.get("model", "ceiling")), text, "length")
    out["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
    return JSONResponse(out)


async def completions_sse_starlette(request: Request) -> Response:
    body = await request.json()
    if not body.get("stream"):
        return await completions(request)
    return EventSourceResponse(_payloads(body), ping=3600)


async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": "ceiling", "object": "model", "owned_by": "bench"}]})


app = Starlette(
    routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models),
        Route("/sse/v1/completions", completions_sse_starlette, methods=["POST"]),
        Route("/sse/v1/models", models),
    ]
)
