"""GenerationStream: one HTTP request's engine requests (one per prompt), merged into one iterator.

Shared by every route of both dialects: submit, wait for each request's first output (so rejections
such as prompt-too-long or queue-full surface before any response bytes), then iterate batches of
`(prompt_index, delta)` in arrival order. A batch is every delta ready at once (one or more engine
steps', from `Engine.generate_batches`), with each sequence's deltas merged into one (`coalesce`: a front
end that falls behind writes fewer, larger events), so a stream writes it with one send. `close()` aborts
whatever is unfinished, which is how a client disconnect returns KV blocks to the pool. Latency and
token metrics are observed here, once per batch.

`close()` also charges the key's token budget (--key-tokens-per-minute) with what the requests used,
however they ended: the usage where the final delta arrived, else the prompt and the tokens delivered so
far (charging only the final usage let a client that disconnects one event early use tokens for free). A
request still running at the drain timeout is interrupted (gateway.shutdown): aborted, and the stream
raises the drain's error after the deltas before it.

A single prompt (the common case) is read straight from the engine in the consumer's task; only
list prompts need a task per prompt and a queue to merge them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

from gateway.errors import RequestTimeoutError
from gateway.key_limits import charge_tokens
from gateway.metrics import GatewayMetrics
from gateway.shutdown import on_drain_timeout
from runtime.engine import Engine
from runtime.errors import EngineFailedError
from runtime.request import GenerationRequest, OutputDelta, coalesce

Item = tuple[int, OutputDelta]
_END = None  # queue marker: one prompt's iterator is exhausted
_closing: set[asyncio.Task[None]] = set()  # aclose() tasks of abandoned engine iterators (the loop holds tasks weakly)


class GenerationStream:
    """Runs `requests` on `engine` concurrently; iterate `(prompt_index, OutputDelta)` or `batches()`.

    A delta with finish_reason "error" is raised as EngineFailedError (after the deltas before it);
    with `timeout` (seconds from arrival) the requests get a deadline, and one aborted past it raises
    RequestTimeoutError. Call `close()` when done (idempotent, synchronous so it is safe inside
    cancelled scopes).
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
        self._timers = [_Timer(r.arrival_time, metrics) for r in self.requests]
        self._done = [False] * len(self.requests)
        # Tokens each request used as far as its deltas tell: prompt + generated, then the final usage.
        self._used = [0] * len(self.requests)
        self._interrupted: BaseException | None = None
        self._stopped = False  # stop(): its aborts are how the requests end, not failures
        self._withdraw = on_drain_timeout(self.interrupt)
        self._started = False
        self._closed = False
        # single prompt: the engine's iterator, and what start() read from it
        self._direct: AsyncIterator[list[OutputDelta]] | None = None
        self._pending: list[Item] = []
        self._pending_error: BaseException | None = None
        # several prompts: one pump task each, merged through a queue
        self._queue: asyncio.Queue[tuple[int, list[Item] | None, BaseException | None]] = asyncio.Queue()
        self._first: list[asyncio.Future[None]] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Submit every request and wait for each one's first output; on a rejection abort all, re-raise."""
        self._started = True
        try:
            if self._interrupted is not None:  # interrupted before submitting: there is nothing to abort
                raise self._interrupted
            if len(self.requests) == 1:
                self._direct = self._engine.generate_batches(self.requests[0])
                items, error = await self._read_direct()
                if error is not None and not items:
                    raise error
                self._pending, self._pending_error = items, error
                return
            loop = asyncio.get_running_loop()
            self._first = [loop.create_future() for _ in self.requests]
            self._tasks = [asyncio.create_task(self._pump(i, r)) for i, r in enumerate(self.requests)]
            await asyncio.gather(*self._first)
        except BaseException:
            self.close()
            raise

    def __aiter__(self) -> AsyncIterator[Item]:
        return self._items()

    async def _items(self) -> AsyncIterator[Item]:
        async for batch in self.batches():
            for item in batch:
                yield item

    async def batches(self) -> AsyncIterator[list[Item]]:
        """Lists of `(prompt_index, delta)`: everything that was ready at once, never empty."""
        if not self._started:
            await self.start()
        try:
            if self._direct is not None:
                items, error = self._pending, self._pending_error
                self._pending, self._pending_error = [], None
                while True:
                    if items:
                        yield items
                    if error is not None:
                        raise error
                    if self._done[0]:
                        return
                    items, error = await self._read_direct()
            else:
                async for batch in self._merged():
                    yield batch
        finally:
            self.close()

    async def _read_direct(self) -> tuple[list[Item], BaseException | None]:
        """The next batch of the single request; ([], None) once it is exhausted."""
        assert self._direct is not None
        try:
            deltas = await self._direct.__anext__()
        except StopAsyncIteration:
            self._finish(0)
            return [], None
        except Exception as exc:  # typed rejections and failures travel to the consumer
            return [], exc
        return self._accept(0, deltas)

    async def _merged(self) -> AsyncIterator[list[Item]]:
        remaining = len(self.requests)
        while remaining:
            entries = [await self._queue.get()]
            while not self._queue.empty():
                entries.append(self._queue.get_nowait())
            batch: list[Item] = []
            for _, items, exc in entries:
                if exc is not None:
                    if batch:
                        yield batch
                    raise exc
                if items is _END:
                    remaining -= 1
                else:
                    batch.extend(items)
            if batch:
                yield batch

    def close(self) -> None:
        """Abort every unfinished request and stop pumping (no-op after the first call)."""
        if self._closed:
            return
        self._closed = True
        self._withdraw()
        charge_tokens(sum(self._used))
        for task in self._tasks:
            task.cancel()
        for i, request in enumerate(self.requests):
            if not self._done[i]:
                self._engine.abort(request.request_id)
        aclose = getattr(self._direct, "aclose", None)
        if aclose is not None and not self._done[0] and not getattr(self._direct, "ag_running", False):
            # the backend's own cleanup (its `finally`) runs now rather than at garbage collection
            task = asyncio.get_running_loop().create_task(aclose())
            _closing.add(task)
            task.add_done_callback(_closing.discard)
        for fut in self._first:  # mark errors as retrieved: they were raised (or are moot)
            if fut.done() and not fut.cancelled():
                fut.exception()

    def stop(self) -> None:
        """End the unfinished requests early, as a client's stop signal does: each ends normally with what it has
        (finish "abort"), wherever it is, before its submission to the engine too."""
        self._stopped = True
        for request, done in zip(self.requests, self._done, strict=True):
            if not done:
                request.deadline = 0.0  # past: one not handed to the engine yet is aborted as soon as it is
                self._engine.abort(request.request_id)

    def interrupt(self, error: BaseException) -> bool:
        """Abort the unfinished requests; the stream then raises `error` (after the deltas before it).
        False when every request had already finished."""
        self._interrupted = error
        unfinished = [r for r, done in zip(self.requests, self._done, strict=True) if not done]
        for request in unfinished:
            self._engine.abort(request.request_id)
        return bool(unfinished)

    def _accept(self, index: int, deltas: list[OutputDelta]) -> tuple[list[Item], BaseException | None]:
        """The deltas up to the first failure (returned as the error to raise after them), each sequence's merged
        into one item. The metrics see them unmerged: each keeps the time the engine produced it."""
        request = self.requests[index]
        accepted: list[OutputDelta] = []
        error: BaseException | None = None
        for delta in deltas:
            if delta.usage is not None:
                self._used[index] = delta.usage.prompt_tokens + delta.usage.completion_tokens
            else:
                self._used[index] += len(delta.prompt_token_ids or ()) + len(delta.token_ids)
            if delta.finish_reason == "error":
                error = EngineFailedError(delta.error or "generation failed")
                break
            if delta.finish_reason == "abort" and self._interrupted is not None:
                error = self._interrupted
                break
            if (delta.finish_reason == "abort" and not self._stopped and request.deadline is not None
                    and time.monotonic() >= request.deadline):
                error = RequestTimeoutError(self._timeout or 0.0)
                break
            accepted.append(delta)
        self._timers[index].observe(accepted)
        return [(index, delta) for delta in coalesce(accepted)], error

    def _finish(self, index: int) -> None:
        self._done[index] = True
        self._timers[index].finish()

    async def _pump(self, index: int, request: GenerationRequest) -> None:
        first = self._first[index]
        batches = None
        try:
            batches = self._engine.generate_batches(request)
            async for deltas in batches:
                items, error = self._accept(index, deltas)
                if items:
                    if not first.done():
                        first.set_result(None)
                    self._queue.put_nowait((index, items, None))
                if error is not None:
                    raise error
            self._finish(index)
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
            if batches is not None:  # runs the engine's own abort path if we stopped early
                await batches.aclose()


class _Timer:
    """Observes TTFT, inter-token latency, end-to-end latency and token counts for one engine request.

    Once per batch, not per token: a sequence's inter-token gap is the time between the batches
    that carried its tokens (deltas that arrive together are one write to the client anyway).
    """

    def __init__(self, arrival: float, metrics: GatewayMetrics | None) -> None:
        self._arrival = arrival
        self._metrics = metrics
        self._first_seen = False
        self._last: dict[int, float] = {}  # sequence index -> time of the batch with its last tokens

    def observe(self, deltas: list[OutputDelta]) -> None:
        m = self._metrics
        if m is None or not deltas:
            return
        now = time.monotonic()
        for delta in deltas:
            if delta.token_ids:
                # the engine's time stamp where it gives one: held deltas of non-streamed requests arrive together
                at = delta.time or now
                if not self._first_seen:
                    self._first_seen = True
                    m.time_to_first_token.observe(at - self._arrival)
                last = self._last.get(delta.index)
                if last != at:  # == at: this sequence already counted in this batch
                    if last is not None:
                        m.inter_token_latency.observe(at - last)
                    self._last[delta.index] = at
            if delta.usage is not None:
                m.prompt_tokens.inc(delta.usage.prompt_tokens)
                m.generation_tokens.inc(delta.usage.completion_tokens)

    def finish(self) -> None:
        if self._metrics is not None:
            self._metrics.e2e_latency.observe(time.monotonic() - self._arrival)
