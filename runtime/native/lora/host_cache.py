"""HostCache: adapter weights kept in host memory (--max-cpu-loras), least recently used evicted first.

An adapter some request holds (waiting for or using a device slot) is never evicted; when every
resident adapter is in use the cache runs over its size until one is released. Evicting a path adapter
drops its weights (reloaded from disk on next use); evicting a Triton task forgets the task, as
TensorRT-LLM does.
"""

from __future__ import annotations

from collections import OrderedDict

from runtime.adapter_registry import Adapter


class HostCache:
    """Resident adapters in LRU order (oldest first)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("max_cpu_loras must be at least 1")
        self.capacity = capacity
        self._lru: OrderedDict[int, Adapter] = OrderedDict()

    def __contains__(self, adapter: Adapter) -> bool:
        return adapter.key in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    def touch(self, adapter: Adapter) -> None:
        if adapter.key in self._lru:
            self._lru.move_to_end(adapter.key)

    def put(self, adapter: Adapter) -> list[Adapter]:
        """Make `adapter` (whose weights are set) resident; returns the adapters evicted for room
        (never `adapter` itself: it is about to be used)."""
        self._lru[adapter.key] = adapter
        self._lru.move_to_end(adapter.key)
        return self.shrink(keep=adapter)

    def shrink(self, keep: Adapter | None = None) -> list[Adapter]:
        """Evict unused adapters (except `keep`), oldest first, while over capacity."""
        evicted = []
        for adapter in list(self._lru.values()):
            if len(self._lru) <= self.capacity:
                break
            if adapter.users == 0 and adapter is not keep:
                del self._lru[adapter.key]
                adapter.weights = None
                evicted.append(adapter)
        return evicted

    def discard(self, adapter: Adapter) -> None:
        if self._lru.pop(adapter.key, None) is not None:
            adapter.weights = None

    def order(self) -> list[str]:
        """Resident adapter names, least recently used first (tests, debugging)."""
        return [a.name for a in self._lru.values()]
