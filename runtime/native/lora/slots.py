"""DeviceSlots: the device-side adapter cache (--max-loras slots) as stacked A/B tensors per Linear.

Slot s of a Linear holds an adapter's pairs side by side along the rank axis: A [cap, S, in] and
B [cap, S, out], a pair of rank r at rank offset k filling A[k:k+r, s] and B[k:k+r, s, rows]. So a fused
qkv_proj with separate q, k and v adapters is still ONE low-rank product per token. `cap` is
max_lora_rank per fused part. Rank-major layout for both: the first r ranks of every slot are one
contiguous [r * S, in] (A) and [r * S, out] (B) matrix (apply.py multiplies all slots at once without
copying), and each slot's rank row of B is contiguous along `out` (coalesced loads in the CUDA kernels).
Unused rank rows stay zero, so a product over all `cap` ranks equals one over the used ones. On CUDA,
A lives under the Linear's base weight in one [out + cap * S, in] buffer (the base weight is moved
there), so one matmul yields both the base output and every slot's x A^T. A Linear's stacks are
allocated when the first adapter touching it is placed; `version` counts those allocations and
widenings of the CUDA matmul (captured CUDA graphs hold the old addresses and shapes). Slots are
recycled least-recently-used first, and never while pinned by a request. Under tensor parallelism each rank's
stacks hold its share of the adapters (weights.local_pair); rank 0 decides the slots, and `on_change` hands each
placement and clearing on to the other ranks (runtime/native/parallel/workers.py), which `place` and `clear` the same.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

from runtime.errors import InvalidRequestError
from runtime.native.lora.targets import LoraTargets
from runtime.native.lora.weights import LoraPair, LoraWeights, local_pair
from runtime.native.models.fp8 import FP8
from runtime.native.models.linear import Linear


class LinearSlots:
    """Stacked low-rank weights of one Linear for every slot."""

    def __init__(self, in_features: int, out_features: int, num_slots: int, capacity: int,
                 device: torch.device, dtype: torch.dtype, base: Linear | None = None) -> None:
        self.weight: torch.Tensor | None = None  # [out + cap * S, in] with `base` (CUDA): W over A
        self.bias: torch.Tensor | None = None
        if base is None:
            self.a = torch.zeros(capacity, num_slots, in_features, device=device, dtype=dtype)
        else:
            # A's rows go under the base weight, in one buffer (the base weight moves there): one matmul
            # then gives x W^T and every slot's x A^T, and the decode step saves a launch per Linear
            rows = out_features + capacity * num_slots
            self.weight = torch.zeros(rows, in_features, device=device, dtype=dtype)
            self.weight[:out_features].copy_(base.weight)
            base.weight.data = self.weight[:out_features]
            if base.bias is not None:
                self.bias = torch.zeros(rows, device=device, dtype=dtype)
                self.bias[:out_features].copy_(base.bias)
                base.bias.data = self.bias[:out_features]
            self.a = self.weight[out_features:].view(capacity, num_slots, in_features)
        self.b = torch.zeros(capacity, num_slots, out_features, device=device, dtype=dtype)
        self.out_features = out_features
        self.num_slots = num_slots
        self.ranks = [0] * num_slots  # rank columns used per slot
        # the same on the device: the CUDA kernels read only a slot's used rank rows (a graph replays them
        # with whatever adapters the slots hold by then)
        self.device_ranks = torch.zeros(num_slots, dtype=torch.int32, device=device)
        self.used_rank = 0  # max(ranks): the forward multiplies only these columns
        # ranks the CUDA matmul covers: a power of two >= used_rank that never shrinks (a captured graph's
        # matmul shape; growing it changes DeviceSlots.version)
        self.matmul_rank = 0

    def _set_rank(self, slot: int, rank: int) -> None:
        self.ranks[slot] = rank
        self.device_ranks[slot] = rank
        self.used_rank = max(self.ranks)
        if self.used_rank > self.matmul_rank:
            self.matmul_rank = min(1 << (self.used_rank - 1).bit_length(), self.a.shape[0])

    def write(self, slot: int, pairs: list[LoraPair]) -> None:
        self.clear(slot)
        k = 0
        for p in pairs:
            self.a[k : k + p.rank, slot].copy_(p.a)
            self.b[k : k + p.rank, slot, p.start : p.start + p.size].copy_(p.b.T)
            k += p.rank
        self._set_rank(slot, k)

    def clear(self, slot: int) -> None:
        if self.ranks[slot]:
            self.a[:, slot].zero_()
            self.b[:, slot].zero_()
            self._set_rank(slot, 0)


class DeviceSlots:
    """Which adapter (by key) sits in which slot, pin counts, LRU order, and the stacked tensors."""

    def __init__(self, targets: LoraTargets, num_slots: int, max_rank: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        if num_slots < 1:
            raise ValueError("max_loras must be at least 1")
        self.targets = targets
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.device, self.dtype = device, dtype
        self.linears: dict[str, LinearSlots] = {}
        self.owner: list[int | None] = [None] * num_slots  # adapter key per slot
        self.pins = [0] * num_slots
        self._slot_of: dict[int, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # unpinned occupied slots, oldest first
        self.on_allocate: list = []  # callbacks(module name, LinearSlots) when a Linear gets stacks
        self.version = 0  # +1 whenever a Linear gets stacks (and so a hook) or a wider CUDA matmul
        # (slot, key, weights) of each placement, (slot, None, None) of each clearing (tensor parallelism)
        self.on_change: Callable[[int, int | None, LoraWeights | None], None] | None = None

    def capacity(self, module: str) -> int:
        return self.max_rank * len(self.targets.modules[module].part_names)

    def check_fits(self, weights: LoraWeights) -> None:
        """InvalidRequestError when a module's pairs need more rank columns than a slot has."""
        for module, pairs in weights.modules.items():
            need = sum(p.rank for p in pairs)
            if need > self.capacity(module):
                raise InvalidRequestError(
                    f"the adapter's pairs on '{module}' have total rank {need}, more than the "
                    f"{self.capacity(module)} columns a slot holds (max_lora_rank x fused parts)", param="adapter")

    def slot_of(self, key: int) -> int | None:
        return self._slot_of.get(key)

    def can_place(self, key: int) -> bool:
        """The adapter is resident, or a free or unpinned slot can take it."""
        return key in self._slot_of or None in self.owner or bool(self._lru)

    def acquire(self, key: int, weights: LoraWeights) -> tuple[int, bool, int | None] | None:
        """Pin a slot holding adapter `key`: (slot, was it already there, evicted key). None if all are pinned."""
        slot = self._slot_of.get(key)
        evicted = None
        hit = slot is not None
        if slot is None:
            if None in self.owner:
                slot = self.owner.index(None)
            elif self._lru:
                slot, _ = self._lru.popitem(last=False)
                evicted = self.owner[slot]
                del self._slot_of[evicted]  # type: ignore[arg-type]
            else:
                return None
            self.place(slot, key, weights)
        self._lru.pop(slot, None)
        self.pins[slot] += 1
        return slot, hit, evicted

    def release(self, slot: int) -> None:
        self.pins[slot] -= 1
        assert self.pins[slot] >= 0, f"slot {slot} released more often than acquired"
        if self.pins[slot] == 0 and self.owner[slot] is not None:
            self._lru[slot] = None  # most recently used at the end

    def drop(self, key: int) -> bool:
        """Free adapter `key`'s slot now (unloaded adapter); False when it is pinned or absent."""
        slot = self._slot_of.get(key)
        if slot is None or self.pins[slot]:
            return False
        del self._slot_of[key]
        self._lru.pop(slot, None)
        self.clear(slot)
        return True

    def clear(self, slot: int) -> None:
        """Empty `slot` (its adapter dropped)."""
        self.owner[slot] = None
        for stacks in self.linears.values():
            stacks.clear(slot)
        if self.on_change is not None:
            self.on_change(slot, None, None)

    def _folds(self, linear: Linear) -> bool:
        """A under the base weight in one buffer: on CUDA, for 16-bit weights (an FP8 or INT4 weight has its own
        product)."""
        return self.device.type == "cuda" and linear.weight is not None and linear.weight.dtype != FP8

    def allocate(self, module: str) -> LinearSlots:
        """The stacks of `module`, allocated (zeros) on first use."""
        stacks = self.linears.get(module)
        if stacks is None:
            linear = self.targets.modules[module]
            stacks = LinearSlots(linear.in_features, linear.out_features, self.num_slots, self.capacity(module),
                                 self.device, self.dtype, base=linear if self._folds(linear) else None)
            self.linears[module] = stacks
            self.version += 1
            for callback in self.on_allocate:
                callback(module, stacks)
        return stacks

    @property
    def nbytes(self) -> int:
        return sum(s.a.numel() * s.a.element_size() + s.b.numel() * s.b.element_size() for s in self.linears.values())

    def place(self, slot: int, key: int, weights: LoraWeights) -> None:
        """Write adapter `key`'s weights (this rank's share of them) into `slot`."""
        for module, stacks in self.linears.items():
            if module not in weights.modules:
                stacks.clear(slot)
        for module, pairs in weights.modules.items():
            stacks = self.allocate(module)
            matmul_rank = stacks.matmul_rank
            linear = self.targets.modules[module]
            stacks.write(slot, [local_pair(linear, pair) for pair in pairs])
            self.version += stacks.matmul_rank != matmul_rank  # a wider matmul: graphs are recaptured
        self.owner[slot] = key
        self._slot_of[key] = slot
        if self.on_change is not None:
            self.on_change(slot, key, weights)
