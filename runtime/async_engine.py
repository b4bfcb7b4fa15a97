"""AsyncEngine: the front-end half of an Engine whose core yields token-level deltas (vLLM v1's AsyncLLM).

    validate and tokenize -> hand the request to the core (`_add`) -> read its deltas -> OutputProcessor (text,
    stop strings) -> the caller; a stop string matched here ends its sample in the core (`abort`)

Its two kinds differ only in how a request reaches the core and its deltas come back: NativeEngine
(runtime/native/llm_engine.py: the core stepped by a thread of this process) and EngineClient (runtime/process/client.py:
the core in a process of its own).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from runtime.config import EngineConfig
from runtime.delivery import Mailbox, read_batches
from runtime.engine import Engine, deltas_of
from runtime.output_processor import OutputProcessor
from runtime.request import GenerationRequest, OutputDelta
from runtime.tokenizer import Tokenizer
from runtime.validation import PreparedRequest, validate_request
from runtime.workers import WorkerPool, is_heavy


class AsyncEngine(Engine):
    """Validation, the core's deltas per request and their text (see the module docstring)."""

    config: EngineConfig
    tokenizer: Tokenizer  # once started
    outputs: OutputProcessor  # once started
    _prepare: WorkerPool  # tokenizing large prompts and bad words, off the event loop

    def generate(self, request: GenerationRequest) -> AsyncIterator[OutputDelta]:
        return deltas_of(self.generate_batches(request))

    async def generate_batches(self, request: GenerationRequest) -> AsyncIterator[list[OutputDelta]]:
        """Every delta already received for the request, in one list per wake-up (one or more steps')."""
        self._check_ready()  # preparing needs the loaded tokenizer
        prepared = await self._prepare.call(is_heavy(request), self._validate, request)
        queue = await self._add(request, prepared)
        text = self.outputs.add_request(request, prepared.prompt_token_ids)
        request_id, samples = request.request_id, request.sampling.n
        # the consumer leaving early (client gone) aborts the request in the core, which frees its blocks
        async with contextlib.aclosing(read_batches(queue, lambda: self._forget(request_id))) as batches:
            async for batch in batches:
                batch, stopped = text.process(batch)
                for index in stopped:
                    self.abort(request_id, index if samples > 1 else None)
                if batch:
                    yield batch

    def _validate(self, request: GenerationRequest) -> PreparedRequest:
        return validate_request(request, tokenizer=self.tokenizer, vocab_size=self.model_info.vocab_size,
                                context_window=self.model_info.context_window, config=self.config,
                                max_num_tokens=self.model_info.max_num_tokens)

    @abc.abstractmethod
    def _check_ready(self) -> None:
        """Raise EngineNotReadyError unless requests are taken."""

    @abc.abstractmethod
    async def _add(self, request: GenerationRequest, prepared: PreparedRequest) -> asyncio.Queue[Any] | Mailbox:
        """Hand a validated request to the core; the queue its deltas arrive in (END after the last, or a refusal).
        Raises the refusals known at once (duplicate id, queue full, grammar, adapter...)."""

    @abc.abstractmethod
    def abort(self, request_id: str, index: int | None = None) -> None:
        """End the request in the core, or only its sample `index` (a stop string matched); unknown ids are
        ignored."""

    def _forget(self, request_id: str) -> None:
        """The consumer left before the request's end."""
        self.abort(request_id)
