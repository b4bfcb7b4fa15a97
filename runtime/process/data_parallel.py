"""--data-parallel-size N: N engine cores behind one front end, each a whole copy of the model (one per GPU, or per
tensor-parallel group of GPUs; on the CPU they share the cores).

The front end validates, tokenizes and makes text once, as for one core (AsyncEngine); each request then goes to
the core runtime/process/router.py picks (the fewest queued tokens; a cached prefix's core first) through that
core's EngineClient, which keeps its process, sockets and deltas. A core that dies fails its own requests (each
stream ends with an error) and gets no more; the others serve on, and `degraded` turns /health to 503 until the
server is restarted. The server exits only when no core is left. LoRA adapters are loaded into and unloaded from
every core; stats are summed over the cores, and `core_stats` gives each core's own (/metrics labels them by core).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator
from pathlib import Path

from runtime.async_engine import AsyncEngine
from runtime.config import EngineConfig
from runtime.default_model import gguf_to_convert
from runtime.delivery import Mailbox
from runtime.engine import CoreStats, EngineStats, ModelInfo
from runtime.errors import EngineNotReadyError, InvalidRequestError
from runtime.process.client import EngineClient
from runtime.process.router import Router
from runtime.request import GenerationRequest, OutputDelta
from runtime.served_model import convert_apart
from runtime.tokenizer import tokenizer_class
from runtime.validation import PreparedRequest
from runtime.workers import WorkerPool

_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver sees (the front end has no torch)


def core_devices(config: EngineConfig, gpus: int | None = None) -> list[str]:
    """The device of each core: GPU i * tensor_parallel_size where there are GPUs (and the config asks for none in
    particular), the configured device otherwise; ValueError when the GPUs are too few."""
    size, tp = config.data_parallel_size, config.tensor_parallel_size
    if gpus is None:
        gpus = len(os.listdir(_NVIDIA_GPUS)) if _NVIDIA_GPUS.is_dir() else 0
    if config.device.startswith("cuda:"):
        raise ValueError("--data-parallel-size places its cores on cuda:0, cuda:1, ...: give --device cuda or auto "
                         "(and CUDA_VISIBLE_DEVICES to choose the GPUs)")
    if config.device == "cpu" or (config.device == "auto" and gpus == 0):
        return [config.device] * size
    if size * tp > gpus:
        raise ValueError(f"--data-parallel-size {size} x --tensor-parallel-size {tp} needs {size * tp} GPUs; "
                         f"{gpus} found")
    return [f"cuda:{core * tp}" for core in range(size)]


class DataParallelEngine(AsyncEngine):
    """N EngineClients, one request to one core (see the module docstring)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._devices = core_devices(config)
        self._converting = gguf_to_convert(config.model, config.dtype)
        self.cores: list[EngineClient] = []
        if self._converting is None:
            self._make_cores()
        else:  # converted once, in start(), before the cores (each would convert it)
            self.model_info = ModelInfo(config.served_model_name or self._converting, 0, 0, "native")
        self.router = Router(config.data_parallel_size, config.kv_block_size)
        self._owners: dict[str, tuple[int, GenerationRequest]] = {}  # request id -> its core, and the request
        self._phase: str | None = None
        self._started = False
        self._prepare = WorkerPool("prepare")

    def _make_cores(self) -> None:
        self.cores = [EngineClient(dataclasses.replace(self.config, device=device, data_parallel_size=1))
                      for device in self._devices]
        self.model_info = self.cores[0].model_info

    async def start(self) -> None:
        if self._converting is not None:
            self._phase = "converting the GGUF file into a checkpoint (once: it is cached for the next starts)"
            await asyncio.to_thread(convert_apart, self.config)
            self._make_cores()
        self._phase = None
        # transformers' lazy import of the tokenizer's class, done once before the cores load their tokenizers in
        # threads at once (two threads importing together found `transformers.AutoTokenizer` missing)
        await asyncio.to_thread(tokenizer_class, self.config.tokenizer or self.cores[0].model_path)
        await asyncio.gather(*(core.start() for core in self.cores))
        self.tokenizer, self.outputs = self.cores[0].tokenizer, self.cores[0].outputs
        self._started = True

    async def shutdown(self, drain_timeout: float = 0.0) -> None:
        await asyncio.gather(*(core.shutdown(drain_timeout) for core in self.cores))
        self._prepare.shutdown()

    # ---- requests -----------------------------------------------------------------------------
    async def generate_batches(self, request: GenerationRequest) -> AsyncIterator[list[OutputDelta]]:
        try:
            # closed here, before the owner is forgotten below: a consumer that leaves early (client gone) has the
            # request aborted in its core through _forget, which needs the owner
            async with contextlib.aclosing(super().generate_batches(request)) as batches:
                async for batch in batches:
                    yield batch
        finally:  # finished, failed, refused or abandoned: its tokens leave its core's count
            # (a refused duplicate of a running id leaves that request's entry alone)
            if self._owners.get(request.request_id, (0, None))[1] is request:
                del self._owners[request.request_id]
                self.router.finish(request.request_id)

    async def _add(self, request: GenerationRequest, prepared: PreparedRequest) -> Mailbox:
        request_id = request.request_id
        if request_id in self._owners:
            raise InvalidRequestError(f"request_id {request_id!r} is already running", param="request_id")
        for index, core in enumerate(self.cores):
            if not core.ready:
                self.router.lose(index)
        try:
            index = self.router.pick(request_id, prepared.prompt_token_ids, prepared.max_tokens)
        except ValueError as exc:
            raise EngineNotReadyError(f"The engine is not serving: {exc}") from exc
        try:
            queue = await self.cores[index]._add(request, prepared)
        except BaseException:
            self.router.finish(request_id)
            raise
        self._owners[request_id] = (index, request)
        return queue

    def _check_ready(self) -> None:
        if not self.ready:
            raise EngineNotReadyError("The engine is not serving: " + (self.degraded or "not started"))

    def abort(self, request_id: str, index: int | None = None) -> None:
        if request_id in self._owners:
            self.cores[self._owners[request_id][0]].abort(request_id, index)

    def _forget(self, request_id: str) -> None:
        if request_id in self._owners:
            self.cores[self._owners[request_id][0]]._forget(request_id)

    # ---- state --------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._started and any(core.ready for core in self.cores)

    @property
    def degraded(self) -> str | None:
        failures = [f"engine core {index}: {core._failure}" for index, core in enumerate(self.cores)
                    if core._failure is not None]
        return "; ".join(failures) or None

    @property
    def phase(self) -> str | None:
        return self._phase or next((core.phase for core in self.cores if core.phase is not None), None)

    def stats(self) -> EngineStats:
        """The live cores' counters summed (a dead core's last ones are stale), the block size they share once."""
        total = EngineStats()
        for core in [core for core in self.cores if core.ready] or self.cores:
            stats = core.stats()
            for field in dataclasses.fields(EngineStats):
                mine, theirs = getattr(total, field.name), getattr(stats, field.name)
                if isinstance(theirs, dict):
                    setattr(total, field.name, {key: mine.get(key, 0) + theirs.get(key, 0)
                                                for key in {*mine, *theirs}})
                elif field.name == "kv_tokens_per_block":
                    total.kv_tokens_per_block = max(mine, theirs)
                else:
                    setattr(total, field.name, mine + theirs)
        return total

    def core_stats(self) -> list[CoreStats]:
        """Each core's figures for /metrics, so that an operator sees which core is down or loaded."""
        return [CoreStats(core.ready, self.router.queued[index],
                          EngineStats() if core._failure is not None else core.stats())
                for index, core in enumerate(self.cores)]

    # ---- LoRA adapters: every core serves every adapter ----------------------------------------
    def lora_adapters(self) -> dict[str, str] | None:
        return next((core for core in self.cores if core.ready), self.cores[0]).lora_adapters()

    async def load_lora_adapter(self, name: str, path: str) -> None:
        await asyncio.gather(*(core.load_lora_adapter(name, path) for core in self.cores if core.ready))

    async def unload_lora_adapter(self, name: str) -> None:
        await asyncio.gather(*(core.unload_lora_adapter(name) for core in self.cores if core.ready))
