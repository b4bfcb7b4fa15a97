"""SyntheticEngine: a benchmark-only Engine that runs NO model.

It exists to measure the gateway's own cost (HTTP, adapters, SSE) without model time. It is never
selectable from `trtllm-gateway serve`; only benchmarks construct it and hand it to
`gateway.app.create_app(settings, engine=...)`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from benchmarks.dataset import word_token_ids
from runtime.engine import Engine, EngineStats, ModelInfo, deltas_of
from runtime.errors import EngineNotReadyError, InvalidRequestError, PromptTooLongError
from runtime.request import GenerationRequest, OutputDelta, Usage
from runtime.tokenizer import Tokenizer


class _Stream:
    """Loop side of one request: deltas delivered by the step thread, and the consumer's waiter."""

    __slots__ = ("deltas", "waiter")

    def __init__(self) -> None:
        self.deltas: deque[OutputDelta] = deque()
        self.waiter: asyncio.Future[None] | None = None

    def push(self, delta: OutputDelta) -> None:
        self.deltas.append(delta)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def next_batch(self) -> list[OutputDelta]:
        """Every delta delivered so far (waits for at least one)."""
        while not self.deltas:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            self.waiter = None
        batch = list(self.deltas)
        self.deltas.clear()
        return batch


@dataclass
class _Seq:
    """Thread side of one sequence (a request with n > 1 has n of them)."""

    request_id: str
    index: int
    max_tokens: int
    stream: _Stream
    hold: bool = False  # a non-streamed request: deltas go over once, at the end, as the native engine does
    held: list[OutputDelta] = field(default_factory=list)
    emitted: int = 0


class SyntheticEngine(Engine):
    """Emits tokens WITHOUT running a model: one step gives one token to every running sequence, and
    the whole step's deltas are delivered together, as the native engine delivers them.

    Two ways to run the steps:
      threaded=True   a step loop in a background thread, like the native engine: each step's deltas
                      go to the event loop with one `call_soon_threadsafe` (or, while an earlier
                      hand-over still waits for the loop, join it: a real step takes milliseconds, so
                      the native engine never runs that far ahead). Measures the gateway together
                      with the cross-thread hand-over (GIL and thread wake-ups) a real engine adds.
      threaded=False  the steps run on the event loop itself, one per loop iteration: no thread, so
                      what is measured is the gateway's own cost and nothing else.

    `step_delay` is the time one step takes (seconds; 0: as fast as possible). Output tokens cycle
    through single-word vocabulary tokens; prompts are tokenised for real; outputs always run to
    `max_tokens` (finish_reason "length"); stop strings, EOS and sampling options are ignored.
    """

    def __init__(
        self,
        tokenizer_path: str,
        step_delay: float = 0.0,
        model_name: str = "synthetic",
        context_window: int = 8192,
        max_batch_size: int = 1024,
        threaded: bool = True,
    ) -> None:
        self.tokenizer = Tokenizer.from_pretrained(tokenizer_path)
        self.model_info = ModelInfo(
            name=model_name, context_window=context_window, vocab_size=self.tokenizer.vocab_size,
            backend="synthetic", dtype="none", device="cpu",
        )
        self.step_delay = step_delay
        self.max_batch_size = max_batch_size
        self.threaded = threaded
        ids = word_token_ids(self.tokenizer.hf)[:64]
        self._vocab = [(i, self.tokenizer.decode([i])) for i in ids]
        self._cv = threading.Condition()
        self._waiting: deque[_Seq] = deque()  # guarded by _cv
        self._aborted: set[str] = set()  # guarded by _cv
        self._running: list[_Seq] = []  # stepping side only
        self._iterations = 0
        self._generated = 0
        self._prompt_tokens = 0
        self._started = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._step_scheduled = False  # threaded=False: a step is queued on the loop
        # threaded=True: deltas handed to the loop but not yet delivered (at most one wake-up pending)
        self._outbox: list[tuple[_Stream, OutputDelta]] = []  # guarded by _outbox_lock
        self._outbox_lock = threading.Lock()

    @property
    def ready(self) -> bool:
        return self._started and not self._stopping

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._started = True
        if self.threaded:
            self._thread = threading.Thread(target=self._step_loop, name="synthetic-engine", daemon=True)
            self._thread.start()

    async def shutdown(self, drain_timeout: float = 0.0) -> None:
        deadline = time.monotonic() + drain_timeout
        while (self._running or self._waiting) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        for seq in [*self._running, *self._waiting]:  # unfinished requests end as aborted
            seq.stream.push(OutputDelta(seq.request_id, seq.index, finish_reason="abort"))
        self._running.clear()
        self._waiting.clear()

    def abort(self, request_id: str) -> None:
        with self._cv:
            self._aborted.add(request_id)
            self._cv.notify()
        self._schedule_step()

    def stats(self) -> EngineStats:
        running = len(self._running)
        return EngineStats(
            waiting=len(self._waiting), running=running, scheduled=running, generation_requests=running,
            max_batch_size=self.max_batch_size, iterations=self._iterations,
            prompt_tokens_total=self._prompt_tokens, generation_tokens_total=self._generated,
        )

    def generate(self, request: GenerationRequest) -> AsyncIterator[OutputDelta]:
        return deltas_of(self.generate_batches(request))

    async def generate_batches(self, request: GenerationRequest) -> AsyncIterator[list[OutputDelta]]:
        if not self.ready:
            raise EngineNotReadyError("the synthetic engine is not running")
        prompt_ids = request.prompt_token_ids
        if prompt_ids is None:
            prompt_ids = self.tokenizer.encode(request.prompt or "", request.add_special_tokens)
        window = self.model_info.context_window
        max_tokens = request.sampling.max_tokens
        if max_tokens is None:
            max_tokens = window - len(prompt_ids)
        if max_tokens < 1:
            raise InvalidRequestError("max_tokens must be at least 1", param="max_tokens")
        if len(prompt_ids) + max_tokens > window:
            raise PromptTooLongError(len(prompt_ids), max_tokens, window)
        n = max(1, request.sampling.n)
        stream = _Stream()
        with self._cv:
            self._waiting.extend(_Seq(request.request_id, i, max_tokens, stream, hold=not request.stream)
                                 for i in range(n))
            self._prompt_tokens += len(prompt_ids)
            self._cv.notify()
        self._schedule_step()
        finished = 0
        first = True
        try:
            while finished < n:
                batch = await stream.next_batch()
                if first:
                    batch[0].prompt_token_ids = list(prompt_ids)
                    first = False
                for delta in batch:
                    if delta.finish_reason is not None:
                        finished += 1
                        if finished == n:
                            delta.usage = Usage(prompt_tokens=len(prompt_ids), completion_tokens=n * max_tokens)
                yield batch
        finally:
            if finished < n:  # consumer left early (client gone) or shutdown
                self.abort(request.request_id)

    def _step(self) -> list[tuple[_Stream, OutputDelta]] | None:
        """One step: drop aborted sequences, admit waiting ones, one token for each running one.
        Returns the step's deltas (empty when idle); None once shutting down."""
        vocab = self._vocab
        with self._cv:
            if self._stopping:
                return None
            if self._aborted:
                self._running = [s for s in self._running if s.request_id not in self._aborted]
                self._waiting = deque(s for s in self._waiting if s.request_id not in self._aborted)
                self._aborted.clear()
            while self._waiting and len(self._running) < self.max_batch_size:
                self._running.append(self._waiting.popleft())
        batch = []
        now = time.monotonic()
        for seq in self._running:
            token_id, text = vocab[seq.emitted % len(vocab)]
            seq.emitted += 1
            finish = "length" if seq.emitted >= seq.max_tokens else None
            delta = OutputDelta(seq.request_id, seq.index, [token_id], text, finish_reason=finish, time=now)
            if seq.hold:
                seq.held.append(delta)
                if finish is None:
                    continue
                batch.extend((seq.stream, d) for d in seq.held)
            else:
                batch.append((seq.stream, delta))
        if self._running:
            self._iterations += 1
            self._generated += len(self._running)
            self._running = [s for s in self._running if s.emitted < s.max_tokens]
        return batch

    # -- threaded=False: steps on the event loop --

    def _schedule_step(self) -> None:
        if self.threaded or self._step_scheduled or self._loop is None:
            return
        self._step_scheduled = True
        if self.step_delay:
            self._loop.call_later(self.step_delay, self._loop_step)
        else:
            self._loop.call_soon(self._loop_step)

    def _loop_step(self) -> None:
        self._step_scheduled = False
        batch = self._step()
        if batch is None:
            return
        for stream, delta in batch:
            stream.push(delta)
        if self._running or self._waiting:
            self._schedule_step()

    # -- threaded=True: steps in a background thread --

    def _step_loop(self) -> None:
        assert self._loop is not None
        while True:
            with self._cv:
                while not (self._stopping or self._waiting or self._running or self._aborted):
                    self._cv.wait()
            batch = self._step()
            if batch is None:
                return
            if batch:  # empty: every running sequence is a held (non-streamed) one
                with self._outbox_lock:
                    wake = not self._outbox  # else the wake-up already scheduled delivers this step too
                    self._outbox.extend(batch)
                if wake:
                    self._loop.call_soon_threadsafe(self._deliver)
            # sleep(0) still releases the GIL, so the event loop gets to run between steps
            time.sleep(self.step_delay)

    def _deliver(self) -> None:
        """On the loop: every step's deltas handed over since the last delivery."""
        with self._outbox_lock:
            batch, self._outbox = self._outbox, []
        for stream, delta in batch:
            stream.push(delta)
