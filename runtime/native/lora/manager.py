"""LoraManager: the native engine's adapter service (registry, two cache levels, admission, hooks).

Threads: registration and request resolution run on the caller's thread (event loop or a worker),
admission and release on the engine thread, loading from disk on one loader thread; one lock guards
all state. A request holds its adapter from `acquire` to `finish`, which protects the adapter from
eviction on both levels. The engine hands a request to the scheduler only once its adapter sits in a
device slot (`admit`): a request whose adapter is still loading from disk, or that finds every slot
pinned by other adapters' requests, waits here while everything else keeps running.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runtime.config import EngineConfig
from runtime.errors import (
    InvalidRequestError,
    UnknownAdapterError,
    UnknownLoraTaskError,
)
from runtime.native.lora.apply import LoraBatch, LoraDelta
from runtime.native.lora.host_cache import HostCache
from runtime.native.lora.peft import load_peft_adapter
from runtime.peft_config import read_peft_config
from runtime.adapter_registry import Adapter, AdapterRegistry
from runtime.native.lora.slots import DeviceSlots, LinearSlots
from runtime.native.lora.targets import LoraTargets
from runtime.native.lora.trtllm_format import weights_from_trtllm
from runtime.native.lora.weights import LoraWeights
from runtime.native.models import CausalLM
from runtime.request import GenerationRequest

logger = logging.getLogger(__name__)


class LoraManager:
    """Adapters of one model: register/unregister, resolve requests, place them in device slots."""

    def __init__(self, config: EngineConfig, model: CausalLM, on_ready: Callable[[], None] = lambda: None) -> None:
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.max_rank = config.max_lora_rank
        self.targets = LoraTargets(model)
        self.registry = AdapterRegistry()
        self.host = HostCache(config.max_cpu_loras)
        self.slots = DeviceSlots(self.targets, config.max_loras, config.max_lora_rank, self.device, self.dtype)
        self.batch = LoraBatch(config.max_loras, self.device, self.dtype)
        self.slots.on_allocate.append(self._install_hook)
        self.on_ready = on_ready  # called (from the loader thread) when a load finished
        self._lock = threading.RLock()
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lora-loader")
        self._held: dict[str, Adapter] = {}  # request id -> adapter, from acquire to finish
        self._waiting: list[str] = []  # request ids waiting for weights or a slot, oldest first
        self._slot: dict[str, int] = {}  # request id -> pinned device slot
        self.hits = self.misses = self.evictions = self.host_evictions = 0
        self.request_counts: dict[str, int] = {}
        if config.lora_modules:
            # Adapters are configured: take the slots' device memory now, before the engine sizes the KV
            # cache from what is left (run-time-only loading allocates on first use).
            for module in self.targets.modules:
                self.slots.allocate(module)
        for name, path in config.lora_modules.items():
            # Startup validates every adapter's config; weights are read while the host cache has room.
            self.register(name, path, load=len(self.host) < self.host.capacity)

    def _install_hook(self, module: str, stacks: LinearSlots) -> None:
        self.targets.modules[module].delta = LoraDelta(self.batch, stacks)

    # ---- registry ----------------------------------------------------------------------------
    def register(self, name: str, path: str, load: bool = True) -> Adapter:
        """Add a PEFT adapter under `name` (weights read now when `load`); 400 if invalid or taken."""
        if not name or name != name.strip():
            raise InvalidRequestError("lora_name must be a non-empty name without surrounding spaces",
                                      param="lora_name")
        if not Path(path).is_dir():
            raise InvalidRequestError(f"LoRA adapter path '{path}' is not a folder", param="lora_path")
        with self._lock:
            self._check_name_free(name)  # and again below: reading the weights may take a while
        read_peft_config(path, self.max_rank)
        weights = self._read(path) if load else None
        with self._lock:
            self._check_name_free(name)
            adapter = self.registry.add_path(name, path)
            if weights is not None:
                adapter.weights = weights
                self._evicted(self.host.put(adapter))
        logger.info("LoRA adapter '%s' (id %d) registered from %s", name, adapter.lora_id, path)
        return adapter

    def _check_name_free(self, name: str) -> None:
        if name in self.registry.by_name:
            raise InvalidRequestError(f"The lora adapter '{name}' has already been loaded.", param="lora_name")

    def unregister(self, name: str) -> None:
        """Remove a path adapter; requests already holding it finish with it."""
        with self._lock:
            adapter = self.registry.by_name.get(name)
            if adapter is None:
                raise UnknownAdapterError(f"The lora adapter '{name}' cannot be found.")
            self.registry.remove(adapter)
            if adapter.users == 0:
                self._drop(adapter)
        logger.info("LoRA adapter '%s' unloaded", name)

    def adapters(self) -> dict[str, str]:
        """Servable path adapters: name -> folder."""
        with self._lock:
            return self.registry.paths()

    def _read(self, path: str) -> LoraWeights:
        weights = load_peft_adapter(path, self.targets, self.max_rank, self.dtype)
        self.slots.check_fits(weights)
        return weights

    # ---- requests (caller's thread) ----------------------------------------------------------
    def prepare(self, request: GenerationRequest) -> LoraWeights | None:
        """Parse a Triton task's inline weights, unless the task is cached (slow; call without locks)."""
        task = request.lora_task
        if task is None:
            return None
        if request.adapter is not None:
            raise InvalidRequestError("give either a LoRA adapter name or a lora_task_id, not both",
                                      param="lora_task_id")
        if (task.weights is None) != (task.config is None):
            raise InvalidRequestError("lora_weights and lora_config must be sent together",
                                      param="lora_config" if task.config is None else "lora_weights")
        if task.weights is None:
            return None
        with self._lock:
            existing = self.registry.by_id.get(task.task_id)
        if existing is not None and existing.path is not None:
            raise InvalidRequestError(
                f"lora_task_id {task.task_id} is the adapter '{existing.name}' loaded by name; "
                "send the id alone to use it", param="lora_task_id")
        if existing is not None:
            return None  # cached: the cached weights serve, as in TensorRT-LLM
        weights = weights_from_trtllm(task.weights, task.config, self.targets, self.max_rank, self.dtype)
        self.slots.check_fits(weights)
        return weights

    def acquire(self, request_id: str, request: GenerationRequest, weights: LoraWeights | None = None) -> str | None:
        """Resolve the request's adapter and hold it until `finish`; returns its prefix-cache salt
        (None: the base model). `weights`: what `prepare` returned."""
        task = request.lora_task
        if request.adapter is None and task is None:
            return None
        with self._lock:
            if request_id in self._held:
                raise InvalidRequestError(f"request_id {request_id!r} is already running", param="request_id")
            if task is None:
                adapter = self.registry.by_name.get(request.adapter)  # type: ignore[arg-type]
                if adapter is None:
                    known = ", ".join(self.registry.by_name) or "none"
                    raise UnknownAdapterError(f"The adapter '{request.adapter}' is not loaded (loaded: {known}).")
            else:
                adapter = self.registry.by_id.get(task.task_id)
                if adapter is None:
                    if weights is None:
                        raise UnknownLoraTaskError(task.task_id)
                    adapter = self.registry.add_task(task.task_id, weights)
                    self._evicted(self.host.put(adapter))
            return self._hold(request_id, adapter)

    def _hold(self, request_id: str, adapter: Adapter) -> str:
        adapter.users += 1
        adapter.requests += 1
        self.request_counts[adapter.name] = self.request_counts.get(adapter.name, 0) + 1
        self.host.touch(adapter)
        self._held[request_id] = adapter
        return adapter.cache_salt

    # ---- admission (engine thread) -----------------------------------------------------------
    def enqueue(self, request_id: str) -> None:
        """The engine took a request that holds an adapter: it waits here until `admit` places it."""
        with self._lock:
            if request_id in self._held:
                self._waiting.append(request_id)

    def admit(self) -> tuple[list[str], list[tuple[str, str]]]:
        """(request ids now pinned to a device slot, (request id, error) whose adapter failed to load)."""
        ready: list[str] = []
        failed: list[tuple[str, str]] = []
        failed_adapters: list[Adapter] = []
        with self._lock:
            for request_id in list(self._waiting):
                adapter = self._held[request_id]
                if adapter.weights is None:
                    if adapter.error is not None:
                        failed.append((request_id, adapter.error))
                        failed_adapters.append(adapter)
                        self._waiting.remove(request_id)
                    else:
                        self._start_load(adapter)
                    continue
                placed = self.slots.acquire(adapter.key, adapter.weights)
                if placed is None:
                    continue  # every slot is pinned by other adapters' requests
                slot, hit, evicted = placed
                self.hits += hit
                self.misses += not hit
                self.evictions += evicted is not None
                self.host.touch(adapter)
                self._slot[request_id] = slot
                self._waiting.remove(request_id)
                ready.append(request_id)
            for adapter in failed_adapters:  # reported once; a later request retries the load
                adapter.error = None
        return ready, failed

    def has_admissible(self) -> bool:
        """Some waiting request could be admitted (or failed) now: the engine loop should run a step."""
        with self._lock:
            for request_id in self._waiting:
                adapter = self._held[request_id]
                if adapter.error is not None or (adapter.weights is not None and self.slots.can_place(adapter.key)):
                    return True
            return False

    def slot_of(self, request_id: str) -> int:
        """The request's pinned device slot; -1 for the base model."""
        return self._slot.get(request_id, -1)

    def finish(self, request_id: str) -> None:
        """The request ended (or was never queued): unpin its slot and let go of its adapter."""
        with self._lock:
            adapter = self._held.pop(request_id, None)
            if adapter is None:
                return
            if request_id in self._waiting:
                self._waiting.remove(request_id)
            slot = self._slot.pop(request_id, None)
            if slot is not None:
                self.slots.release(slot)
            adapter.users -= 1
            if adapter.users == 0:
                if adapter.removed:
                    self._drop(adapter)
                else:
                    self._evicted(self.host.shrink())

    # ---- loading and eviction ----------------------------------------------------------------
    def _start_load(self, adapter: Adapter) -> None:
        if adapter.loading or adapter.path is None:
            return
        adapter.loading = True
        self._loader.submit(self._load, adapter)

    def _load(self, adapter: Adapter) -> None:
        try:
            weights: LoraWeights | None = self._read(adapter.path)  # type: ignore[arg-type]
            error = None
        except Exception as exc:
            logger.exception("loading LoRA adapter '%s' failed", adapter.name)
            weights, error = None, f"loading LoRA adapter '{adapter.name}' failed: {exc}"
        with self._lock:
            adapter.loading = False
            if weights is not None:
                adapter.weights = weights
                self._evicted(self.host.put(adapter))
            else:
                adapter.error = error
        self.on_ready()

    def _evicted(self, adapters: list[Adapter]) -> None:
        """Host-evicted adapters leave the device too; an evicted Triton task is forgotten."""
        for adapter in adapters:
            self.host_evictions += 1
            self.slots.drop(adapter.key)
            if adapter.path is None:
                self.registry.remove(adapter)

    def _drop(self, adapter: Adapter) -> None:
        self.host.discard(adapter)
        self.slots.drop(adapter.key)

    # ---- metrics -----------------------------------------------------------------------------
    def stats(self) -> dict[str, object]:
        with self._lock:
            return {"lora_loaded": len(self.registry.by_id), "lora_cache_hits": self.hits,
                    "lora_cache_misses": self.misses, "lora_evictions": self.evictions,
                    "lora_requests": dict(self.request_counts)}
