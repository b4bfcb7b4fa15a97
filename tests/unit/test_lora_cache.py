"""LoRA caches and the batched delta, without an engine: device-slot and host-cache eviction order,
in-use protection, and the gather and per-slot paths of the Linear hook against a plain loop."""

from __future__ import annotations

import pytest
import torch

import runtime.native.lora.apply as apply
from runtime.native.lora.apply import LoraBatch, LoraDelta
from runtime.native.lora.host_cache import HostCache
from runtime.adapter_registry import Adapter
from runtime.native.lora.slots import DeviceSlots, LinearSlots
from runtime.native.lora.weights import LoraPair, LoraWeights
from runtime.native.models.linear import Linear


class _Targets:
    """The two attributes DeviceSlots reads from LoraTargets: one fused 2-part Linear."""

    def __init__(self) -> None:
        self.modules = {"layers.0.qkv": Linear(6, [("q", 4), ("v", 2)])}


def _weights(seed: int, rank: int = 2) -> LoraWeights:
    g = torch.Generator().manual_seed(seed)
    w = LoraWeights()
    w.add("layers.0.qkv", LoraPair(0, 4, torch.randn(rank, 6, generator=g), torch.randn(4, rank, generator=g)))
    w.add("layers.0.qkv", LoraPair(4, 2, torch.randn(1, 6, generator=g), torch.randn(2, 1, generator=g)))
    return w


def test_device_slots_evict_least_recently_used_unpinned_slot() -> None:
    slots = DeviceSlots(_Targets(), num_slots=2, max_rank=2, device=torch.device("cpu"), dtype=torch.float32)
    assert slots.version == 0
    assert slots.acquire(1, _weights(1)) == (0, False, None)
    assert slots.acquire(2, _weights(2)) == (1, False, None)
    # the Linear got its stacks, and its CUDA matmul rank grew 0 -> 4 (pairs of rank 2 + 1), once each:
    # the second adapter of the same rank changes neither
    assert slots.version == 2 and slots.linears["layers.0.qkv"].matmul_rank == 4
    assert slots.acquire(1, _weights(1)) == (0, True, None)  # hit: pinned twice now
    assert not slots.can_place(3) and slots.acquire(3, _weights(3)) is None  # all pinned: it must wait
    slots.release(0)
    assert not slots.can_place(3)  # slot 0 is still pinned once
    slots.release(1)
    assert slots.can_place(3)
    assert slots.acquire(3, _weights(3)) == (1, False, 2)  # the only unpinned slot
    slots.release(0)
    slots.release(1)
    # now both unpinned; slot 0 (adapter 1) was released before slot 1 (adapter 3): evicted first
    assert slots.acquire(4, _weights(4)) == (0, False, 1)
    assert slots.slot_of(1) is None and slots.slot_of(3) == 1


def test_device_slot_holds_each_pair_at_its_rank_offset_and_clears_on_drop() -> None:
    slots = DeviceSlots(_Targets(), num_slots=2, max_rank=2, device=torch.device("cpu"), dtype=torch.float32)
    w = _weights(5)
    slot, _, _ = slots.acquire(7, w)
    stacks = slots.linears["layers.0.qkv"]
    assert stacks.a.shape == (4, 2, 6) and stacks.b.shape == (4, 2, 6)  # capacity: 2 parts x rank 2
    q, v = w.modules["layers.0.qkv"]
    assert torch.equal(stacks.a[:2, slot], q.a) and torch.equal(stacks.a[2:3, slot], v.a)
    assert torch.equal(stacks.b[:2, slot, :4], q.b.T) and torch.equal(stacks.b[2:3, slot, 4:], v.b.T)
    assert stacks.b[2:, slot, :4].abs().sum() == 0 and stacks.b[:2, slot, 4:].abs().sum() == 0
    assert stacks.a[3, slot].abs().sum() == 0 and stacks.b[3, slot].abs().sum() == 0  # unused rank row
    # rank-major: the all-slots B of the first r ranks is a view, not a copy
    assert stacks.b[:3].reshape(3 * 2, 6).data_ptr() == stacks.b.data_ptr()
    assert stacks.used_rank == 3
    assert not slots.drop(7)  # pinned
    slots.release(slot)
    assert slots.drop(7)
    assert stacks.a.abs().sum() == 0 and stacks.b.abs().sum() == 0 and stacks.used_rank == 0


def test_pairs_over_a_slots_capacity_are_refused() -> None:
    from runtime.errors import InvalidRequestError

    slots = DeviceSlots(_Targets(), num_slots=1, max_rank=2, device=torch.device("cpu"), dtype=torch.float32)
    w = _weights(1)
    w.add("layers.0.qkv", LoraPair(0, 6, torch.zeros(2, 6), torch.zeros(6, 2)))  # 2 + 1 + 2 > 4 columns
    with pytest.raises(InvalidRequestError, match="total rank 5"):
        slots.check_fits(w)


def test_host_cache_evicts_oldest_unused_and_never_one_in_use() -> None:
    cache = HostCache(capacity=2)
    a, b, c, d = (Adapter(name=n, lora_id=i, path="/p", weights=LoraWeights()) for i, n in enumerate("abcd"))
    assert cache.put(a) == [] and cache.put(b) == []
    cache.touch(a)  # b is now the least recently used
    assert cache.put(c) == [b] and b.weights is None
    a.users = c.users = 1
    assert cache.put(d) == [] and cache.order() == ["a", "c", "d"]  # over capacity: the rest is in use
    assert d.weights is not None
    d.users = 0
    c.users = 0
    assert cache.shrink() == [c] and cache.order() == ["a", "d"]


@pytest.mark.parametrize("all_slots", [True, False])
def test_delta_adds_each_tokens_own_adapter(monkeypatch, all_slots: bool) -> None:
    if not all_slots:  # force the per-slot path
        monkeypatch.setattr(apply, "DENSE_COLUMNS", 0)
        monkeypatch.setattr(apply, "DENSE_TOKENS", 0)
    g = torch.Generator().manual_seed(0)
    stacks = LinearSlots(6, 5, num_slots=3, capacity=4, device=torch.device("cpu"), dtype=torch.float64)
    for slot, rank in ((0, 4), (1, 2), (2, 3)):
        stacks.write(slot, [LoraPair(0, 5, torch.randn(rank, 6, generator=g, dtype=torch.float64),
                                     torch.randn(5, rank, generator=g, dtype=torch.float64))])
    batch = LoraBatch(3, torch.device("cpu"), torch.float64)
    counts, slot_of_seq = [3, 1, 2, 1, 4], [2, -1, 0, 2, 1]
    batch.set(counts, slot_of_seq)
    x = torch.randn(11, 6, generator=g, dtype=torch.float64)
    linear = Linear(6, [("proj", 5)], dtype=torch.float64)
    linear.weight.data.copy_(torch.randn(5, 6, generator=g, dtype=torch.float64))
    y = x @ linear.weight.T
    want = y.clone()
    token_slots = [s for n, s in zip(counts, slot_of_seq) for _ in range(n)]
    for t, s in enumerate(token_slots):
        if s >= 0:
            want[t] += stacks.b[:, s].T @ (stacks.a[:, s] @ x[t])
    got = LoraDelta(batch, stacks)(x, linear)
    torch.testing.assert_close(got, want)
    batch.set(counts, [-1] * 5)  # no adapter in the step: the base projection alone
    assert torch.equal(LoraDelta(batch, stacks)(x, linear), y)
