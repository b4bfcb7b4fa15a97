"""AdapterRegistry: the LoRA adapters an engine can serve (either backend), by name and by integer id.

Two kinds share one id space: adapters registered by path (--lora-modules, POST /v1/load_lora_adapter)
get ids 1, 2, ... in registration order (skipping ids in use), and Triton tasks that brought their own
weights are known by their `lora_task_id`. A Triton request naming a path adapter's id uses it.
Every registration also gets a `key` never reused, so a name unloaded and loaded again with other
weights never matches cached KV blocks or device slots of the old one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the native runtime's weights (torch); the TensorRT-LLM backend keeps none here
    from runtime.native.lora.weights import LoraWeights

_keys = itertools.count(1)


@dataclass(eq=False)
class Adapter:
    """One servable adapter and its host-side state (guarded by the LoraManager's lock)."""

    name: str
    lora_id: int
    path: str | None  # None: a Triton task's inline weights (cannot be reloaded once evicted)
    key: int = 0
    weights: LoraWeights | None = None  # resident in the host cache
    users: int = 0  # requests holding it (waiting, queued or running)
    loading: bool = False
    error: str | None = None  # why the last load from `path` failed
    removed: bool = False
    requests: int = 0  # requests served since registration (metrics)

    def __post_init__(self) -> None:
        self.key = next(_keys)

    @property
    def cache_salt(self) -> str:
        """Prefix-cache salt: KV blocks computed with this adapter match only this registration."""
        return f"lora:{self.key}"


class AdapterRegistry:
    """Name -> Adapter for path adapters, id -> Adapter for both kinds."""

    def __init__(self) -> None:
        self.by_name: dict[str, Adapter] = {}
        self.by_id: dict[int, Adapter] = {}

    def add_path(self, name: str, path: str) -> Adapter:
        lora_id = next(i for i in itertools.count(1) if i not in self.by_id)
        adapter = Adapter(name=name, lora_id=lora_id, path=path)
        self.by_name[name] = adapter
        self.by_id[lora_id] = adapter
        return adapter

    def add_task(self, task_id: int, weights: LoraWeights) -> Adapter:
        adapter = Adapter(name=f"lora_task_{task_id}", lora_id=task_id, path=None, weights=weights)
        self.by_id[task_id] = adapter
        return adapter

    def remove(self, adapter: Adapter) -> None:
        adapter.removed = True
        if self.by_name.get(adapter.name) is adapter:
            del self.by_name[adapter.name]
        if self.by_id.get(adapter.lora_id) is adapter:
            del self.by_id[adapter.lora_id]

    def paths(self) -> dict[str, str]:
        """Path adapters, name -> folder, in registration order."""
        return {name: a.path for name, a in self.by_name.items() if a.path is not None}
