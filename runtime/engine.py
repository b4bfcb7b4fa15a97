"""The engine interface both backends implement (native PyTorch runtime and TensorRT-LLM)."""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runtime.errors import UnsupportedOptionError
from runtime.request import GenerationRequest, OutputDelta

if TYPE_CHECKING:
    from runtime.tokenizer import Tokenizer


@dataclass
class ModelInfo:
    """What the gateway needs to know about the served model."""

    name: str  # served model name
    context_window: int  # max prompt + output tokens
    vocab_size: int
    backend: str  # "native" | "trtllm"
    dtype: str = ""
    device: str = ""
    max_num_tokens: int = 0  # tokens a step holds (--max-num-tokens, else the engine's choice for the model)


@dataclass
class EngineStats:
    """A snapshot of the engine's state; feeds /metrics (our names and the nv_trt_llm_* families)."""

    waiting: int = 0  # queued requests not yet scheduled
    running: int = 0  # requests holding KV blocks (decoding or prefilling)
    paused: int = 0  # preempted requests waiting to resume
    scheduled: int = 0  # requests in the last step
    context_requests: int = 0  # requests prefilling in the last step
    generation_requests: int = 0  # requests decoding in the last step
    context_tokens: int = 0  # prompt tokens computed in the last step
    max_batch_size: int = 0
    max_num_tokens: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    kv_tokens_per_block: int = 0
    iterations: int = 0  # engine steps since start
    eager_iterations: int = 0  # of those, steps run op by op rather than replayed from graphs (native engine)
    prompt_tokens_total: int = 0  # prompt tokens admitted since start
    prefill_tokens_computed: int = 0  # prompt tokens actually run through the model (prefix hits excluded)
    prefix_cache_hit_tokens: int = 0
    generation_tokens_total: int = 0
    preemptions: int = 0
    memory_bytes: dict[str, int] = field(default_factory=dict)  # "gpu" | "cpu" | "pinned"
    lora_loaded: int = 0
    lora_cache_hits: int = 0
    lora_cache_misses: int = 0
    lora_evictions: int = 0
    lora_requests: dict[str, int] = field(default_factory=dict)  # requests per adapter name since start
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_steps: int = 0

    def copy(self) -> EngineStats:
        """A snapshot that later updates of this one do not change."""
        return dataclasses.replace(self, memory_bytes=dict(self.memory_bytes), lora_requests=dict(self.lora_requests))


@dataclass(frozen=True)
class CoreStats:
    """One engine core of several (--data-parallel-size): /metrics labels these figures by core."""

    up: bool  # takes requests (started, not failed, not shutting down)
    queued_tokens: int  # prompt + most tokens to generate of its unfinished requests, as the router counts them
    stats: EngineStats  # its own figures (all zero once its process is gone: no requests, no blocks)


class Engine(abc.ABC):
    """Generate deltas for requests; both backends implement this.

    Lifecycle: `await start()` (loads the model), then any number of `generate()` calls from the
    event loop, then `await shutdown(drain_timeout)`.
    """

    model_info: ModelInfo
    tokenizer: Tokenizer

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def shutdown(self, drain_timeout: float = 0.0) -> None:
        """Stop taking requests, let running ones finish for up to `drain_timeout` s, abort the rest."""

    @abc.abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[OutputDelta]:
        """Validate and enqueue `request`; iterate its deltas.

        Raises typed errors (runtime.errors) from the first `__anext__` for requests that are
        rejected before generation starts (invalid option, prompt too long, queue full, unknown
        adapter). Closing the iterator early (client gone) aborts the request.
        """

    async def generate_batches(self, request: GenerationRequest) -> AsyncIterator[list[OutputDelta]]:
        """`generate`, grouped: each list holds the deltas that were ready together (one or more engine
        steps' worth), so the gateway can write them to a stream at once. Same errors and abort-on-close
        as `generate`. Default: one delta per list; backends that queue deltas override it."""
        deltas = self.generate(request)
        try:
            async for delta in deltas:
                yield [delta]
        finally:
            aclose = getattr(deltas, "aclose", None)
            if aclose is not None:  # run the backend's own abort path now, not at garbage collection
                await aclose()

    @abc.abstractmethod
    def abort(self, request_id: str) -> None:
        """Cancel a request; its KV blocks return to the pool. Unknown ids are ignored."""

    @abc.abstractmethod
    def stats(self) -> EngineStats: ...

    def core_stats(self) -> list[CoreStats]:
        """Each engine core's figures, in core order, where the engine has several (--data-parallel-size); else []."""
        return []

    @property
    def ready(self) -> bool:
        """True once started and until shutdown begins."""
        return False

    @property
    def degraded(self) -> str | None:
        """Why part of the engine stopped serving while the rest serves on (an engine core of several died);
        /health answers 503 with it. None: whole."""
        return None

    @property
    def phase(self) -> str | None:
        """What the engine is doing while it starts, or builds faster code while it serves (None: neither)."""
        return None

    async def warmed_up(self, poll: float = 0.1) -> None:
        """Return once the started engine builds nothing in the background: its steps are those it keeps serving
        with (what benchmarks measure)."""
        while self.phase is not None:
            await asyncio.sleep(poll)

    # LoRA adapters at run time. Defaults: a backend that only serves the configured adapters.
    def lora_adapters(self) -> dict[str, str] | None:
        """Servable LoRA adapters, name -> source folder; None: exactly EngineConfig.lora_modules."""
        return None

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Register a PEFT adapter folder under `name` (InvalidRequestError when invalid or taken)."""
        raise UnsupportedOptionError("load_lora_adapter", self.model_info.backend)

    async def unload_lora_adapter(self, name: str) -> None:
        """Remove adapter `name` (UnknownAdapterError if absent); requests using it finish with it."""
        raise UnsupportedOptionError("unload_lora_adapter", self.model_info.backend)


async def deltas_of(batches: AsyncGenerator[list[OutputDelta], None]) -> AsyncIterator[OutputDelta]:
    """`generate` for backends that implement `generate_batches`: one delta at a time; closing it closes
    `batches` at once (which aborts the request)."""
    try:
        async for batch in batches:
            for delta in batch:
                yield delta
    finally:
        await batches.aclose()
