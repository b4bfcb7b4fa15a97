"""GenerationStream: one HTTP request's engine requests (one per prompt), merged into one iterator.

Shared by every route of both dialects: submit, wait for each request's first output (so rejections
such as prompt-too-long or queue-full surface before any response bytes), then iterate
`(prompt_index, delta)` in arrival order. `close()` aborts whatever is unfinished, which is how a
client disconnect returns KV blocks to the pool. Latency and token metrics are observed here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

from gateway.errors import RequestTimeoutError
from gateway.metrics import GatewayMetrics
from runtime.engine import Engine
from runtime.errors import EngineFailedError
from runtime.request import GenerationRequest, OutputDelta

_END = None  # queue marker: one prompt's iterator is exhausted


class GenerationStream:
    """Runs `requests` on `engine` concurrently; iterate `(prompt_index, OutputDelta)`.

    A delta with finish_reason "error" is raised as EngineFailedError; with `timeout` (seconds from
    arrival) the requests get a deadline, and one aborted past it raises RequestTimeoutError. Call `close()` when done
    (idempotent, synchronous so it is safe inside cancelled scopes).
    """

    def __init__(self, engine: Engine, requests: Sequence[GenerationRequest],
                 metrics: GatewayMetrics | None = None, timeout: float | None = None) -> None:
        self._engine = engine
        self.requests = list(requests)
        self._timeout = timeout
        if timeout is not None:  # the engine aborts at the deadline, freeing the blocks; we report it
            for request in self.requests:
                deadline = request.arrival_time + timeout
                request.deadline = deadline if request.deadline is None else min(request.deadline, deadline)
        self._metrics = metrics
        self._queue: asyncio.Queue[tuple[int, OutputDelta | None, BaseException | None]] = asyncio.Queue()
        self._done = [False] * len(self.requests)
        self._first: list[asyncio.Future[None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    async def start(self) -> None:
        """Submit every request and wait for each one's first output; on a rejection abort all, re-raise."""
        loop = asyncio.get_running_loop()
        self._first = [loop.create_future() for _ in self.requests]
        self._tasks = [asyncio.create_task(self._pump(i, r)) for i, r in enumerate(self.requests)]
        try:
            await asyncio.gather(*self._first)
        except BaseException:
            self.close()
            raise

    def __aiter__(self) -> AsyncIterator[tuple[int, OutputDelta]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[tuple[int, OutputDelta]]:
        if not self._tasks:
            await self.start()
        remaining = len(self.requests)
        try:
            while remaining:
                index, delta, exc = await self._queue.get()
                if exc is not None:
                    raise exc
                if delta is _END:
                    remaining -= 1
                    continue
                yield index, delta
        finally:
            self.close()

    def close(self) -> None:
        """Abort every unfinished request and stop pumping (no-op after the first call)."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for i, request in enumerate(self.requests):
            if not self._done[i]:
                self._engine.abort(request.request_id)
        for fut in self._first:  # mark errors as retrieved: they were raised (or are moot)
            if fut.done() and not fut.cancelled():
                fut.exception()

    def _expired(self, request: GenerationRequest) -> bool:
        return request.deadline is not None and time.monotonic() >= request.deadline

    async def _pump(self, index: int, request: GenerationRequest) -> None:
        first = self._first[index]
        timer = _Timer(request.arrival_time, self._metrics)
        iterator = None
        try:
            iterator = self._engine.generate(request)
            async for delta in iterator:
                if delta.finish_reason == "error":
                    raise EngineFailedError(delta.error or "generation failed")
                if delta.finish_reason == "abort" and self._expired(request):
                    raise RequestTimeoutError(self._timeout or 0.0)
                timer.observe(delta)
                if not first.done():
                    first.set_result(None)
                self._queue.put_nowait((index, delta, None))
            self._done[index] = True
            timer.finish()
            if not first.done():
                first.set_result(None)
            self._queue.put_nowait((index, _END, None))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # typed rejections and failures travel to the consumer
            if not first.done():
                first.set_exception(exc)
            self._queue.put_nowait((index, None, exc))
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:  # runs the engine's own abort path if we stopped early
                await aclose()


class _Timer:
    """Observes TTFT, inter-token latency, end-to-end latency and token counts for one engine request."""

    def __init__(self, arrival: float, metrics: GatewayMetrics | None) -> None:
        self._arrival = arrival
        self._metrics = metrics
        self._first_seen = False
        self._last: dict[int, float] = {}  # sequence index -> time of its last tokens

    def observe(self, delta: OutputDelta) -> None:
        m = self._metrics
        if m is None:
            return
        now = time.monotonic()
        if delta.token_ids:
            if not self._first_seen:
                self._first_seen = True
                m.time_to_first_token.observe(now - self._arrival)
            last = self._last.get(delta.index)
            if last is not None:
                m.inter_token_latency.observe(now - last)
            self._last[delta.index] = now
        if delta.usage is not None:
            m.prompt_tokens.inc(delta.usage.prompt_tokens)
            m.generation_tokens.inc(delta.usage.completion_tokens)

    def finish(self) -> None:
        if self._metrics is not None:
            self._metrics.e2e_latency.observe(time.monotonic() - self._arrival)
