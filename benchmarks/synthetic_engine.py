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
from dataclasses import dataclass

from benchmarks.dataset import word_token_ids
from runtime.engine import Engine, EngineStats, ModelInfo
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

    async def next(self) -> OutputDelta:
        while not self.deltas:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            self.waiter = None
        return self.deltas.popleft()


@dataclass
class _Seq:
    """Thread side of one sequence (a request with n > 1 has n of them)."""

    request_id: str
    index: int
    max_tokens: int
    stream: _Stream
    emitted: int = 0


class SyntheticEngine(Engine):
    """Emits tokens WITHOUT running a model, batched like the native engine delivers them: a step loop
    in a background thread where one step gives one token to every running sequence, and hands the
    whole step's deltas to the event loop with one `call_soon_threadsafe`.

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
    ) -> None:
        self.tokenizer = Tokenizer.from_pretrained(tokenizer_path)
        self.model_info = ModelInfo(
            name=model_name, context_window=context_window, vocab_size=self.tokenizer.vocab_size,
            backend="synthetic", dtype="none", device="cpu",
        )
        self.step_delay = step_delay
        self.max_batch_size = max_batch_size
        ids = word_token_ids(self.tokenizer.hf)[:64]
        self._vocab = [(i, self.tokenizer.decode([i])) for i in ids]
        self._cv = threading.Condition()
        self._waiting: deque[_Seq] = deque()  # guarded by _cv
        self._aborted: set[str] = set()  # guarded by _cv
        self._running: list[_Seq] = []  # step thread only
        self._iterations = 0
        self._generated = 0
        self._prompt_tokens = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def ready(self) -> bool:
        return self._thread is not None and not self._stopping

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = False
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

    def stats(self) -> EngineStats:
        running = len(self._running)
        return EngineStats(
            waiting=len(self._waiting), running=running, scheduled=running, generation_requests=running,
            max_batch_size=self.max_batch_size, iterations=self._iterations,
            prompt_tokens_total=self._prompt_tokens, generation_tokens_total=self._generated,
        )

    def generate(self, request: GenerationRequest) -> AsyncIterator[OutputDelta]:
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[OutputDelta]:
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
            self._waiting.extend(_Seq(request.request_id, i, max_tokens, stream) for i in range(n))
            self._prompt_tokens += len(prompt_ids)
            self._cv.notify()
        finished = 0
        first = True
        try:
            while finished < n:
                delta = await stream.next()
                if first:
                    delta.prompt_token_ids = list(prompt_ids)
                    first = False
                if delta.finish_reason is not None:
                    finished += 1
                    if finished == n:
                        delta.usage = Usage(prompt_tokens=len(prompt_ids), completion_tokens=n * max_tokens)
                yield delta
        finally:
            if finished < n:  # consumer left early (client gone) or shutdown
                self.abort(request.request_id)

    def _step_loop(self) -> None:
        """One iteration = one step: admit waiting sequences, give each running one a token, deliver."""
        assert self._loop is not None
        vocab = self._vocab
        while True:
            with self._cv:
                while not (self._stopping or self._waiting or self._running or self._aborted):
                    self._cv.wait()
                if self._stopping:
                    return
                if self._aborted:
                    self._running = [s for s in self._running if s.request_id not in self._aborted]
                    self._waiting = deque(s for s in self._waiting if s.request_id not in self._aborted)
                    self._aborted.clear()
                while self._waiting and len(self._running) < self.max_batch_size:
                    self._running.append(self._waiting.popleft())
            if not self._running:
                continue
            batch = []
            for seq in self._running:
                token_id, text = vocab[seq.emitted % len(vocab)]
                seq.emitted += 1
                finish = "length" if seq.emitted >= seq.max_tokens else None
                batch.append((seq.stream, OutputDelta(seq.request_id, seq.index, [token_id], text, finish_reason=finish)))
            self._running = [s for s in self._running if s.emitted < s.max_tokens]
            self._iterations += 1
            self._generated += len(batch)
            self._loop.call_soon_threadsafe(_deliver, batch)
            # sleep(0) still releases the GIL, so the event loop gets to run between steps
            time.sleep(self.step_delay)


def _deliver(batch: list[tuple[_Stream, OutputDelta]]) -> None:
    for stream, delta in batch:
        stream.push(delta)
