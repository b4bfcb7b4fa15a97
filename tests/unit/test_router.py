"""runtime/process/router.py: which engine core a request goes to under --data-parallel-size; and what
runtime/process/data_parallel.py does with its cores besides (summed stats, per-core figures on /metrics, adapters on
every core, aborts)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import GatewayMetrics
from runtime.async_engine import AsyncEngine
from runtime.config import EngineConfig
from runtime.engine import EngineStats
from runtime.errors import InvalidRequestError
from runtime.process import router as router_module
from runtime.process.data_parallel import DataParallelEngine, core_devices
from runtime.process.router import AFFINITY_SLACK, Router
from runtime.request import GenerationRequest


def test_a_request_goes_to_the_core_with_the_fewest_queued_tokens() -> None:
    router = Router(3, block_size=4)
    assert [router.pick(f"r{i}", [i] * 3, 10) for i in range(3)] == [0, 1, 2]  # 13 tokens each
    assert router.pick("big", [7] * 3, 100) == 0 and router.queued == [116, 13, 13]
    assert router.pick("next", [8] * 3, 10) == 1 and router.queued == [116, 26, 13]
    router.finish("big")
    router.finish("big")  # (counted once)
    assert router.queued == [13, 26, 13] and router.pick("after", [9] * 3, 1) == 0


def test_a_cached_prefix_brings_its_request_back_to_the_core_that_served_it() -> None:
    router = Router(2, block_size=4)
    system = list(range(100, 112))  # three whole blocks
    assert router.pick("first", system + [1, 2], 50) == 0
    assert router.pick("other", [9] * 14, 10) == 1
    # core 0 is the more queued now, but holds the prefix
    assert router.pick("second", system + [3], 50) == 0
    # a prompt sharing only a partial block shares no cached block: the least queued core
    assert router.pick("partial", system[:3] + [5] * 10, 1) == 1


def test_a_prefix_core_too_far_behind_loses_the_request() -> None:
    router = Router(2, block_size=4)
    prefix = list(range(8))
    assert router.pick("a", prefix, AFFINITY_SLACK - 8) == 0
    assert router.pick("b", prefix, 10) == 0  # AFFINITY_SLACK behind core 1's 0: just within
    assert router.pick("c", prefix, 10) == 1  # now past the slack: the least queued core
    assert router.pick("d", prefix, 10) == 1  # and the prefix is remembered there


def test_dead_cores_get_nothing_and_none_alive_is_an_error() -> None:
    router = Router(2, block_size=4)
    prefix = list(range(8))
    assert router.pick("a", prefix, 1) == 0
    router.lose(0)
    assert router.pick("b", prefix, 1) == 1  # its prefix's core is dead
    router.lose(1)
    with pytest.raises(ValueError, match="no engine core is serving"):
        router.pick("c", prefix, 1)


def test_the_prefix_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(router_module, "TABLE_SIZE", 5)
    router = Router(2, block_size=2)
    for i in range(10):
        router.pick(f"r{i}", [i, i, i, i], 1)  # two prefixes each
    assert len(router._prefixes) == 5


def test_cores_take_a_gpu_each_or_a_tensor_parallel_group_each() -> None:
    assert core_devices(EngineConfig(data_parallel_size=2, device="auto"), gpus=2) == ["cuda:0", "cuda:1"]
    assert core_devices(EngineConfig(data_parallel_size=2, tensor_parallel_size=2), gpus=4) == ["cuda:0", "cuda:2"]
    assert core_devices(EngineConfig(data_parallel_size=3, device="cpu"), gpus=2) == ["cpu"] * 3
    assert core_devices(EngineConfig(data_parallel_size=2, device="auto"), gpus=0) == ["auto"] * 2
    with pytest.raises(ValueError, match="needs 4 GPUs; 2 found"):
        core_devices(EngineConfig(data_parallel_size=2, tensor_parallel_size=2), gpus=2)
    with pytest.raises(ValueError, match="give --device cuda or auto"):
        core_devices(EngineConfig(data_parallel_size=2, device="cuda:1"), gpus=2)


class FakeCore:
    """An EngineClient's surface that DataParallelEngine uses."""

    def __init__(self, stats: EngineStats, ready: bool = True) -> None:
        self._stats, self.ready, self._failure = stats, ready, None if ready else "exited (exit code -9)"
        self.calls: list[tuple[str, ...]] = []

    def stats(self) -> EngineStats:
        return self._stats

    async def load_lora_adapter(self, name: str, path: str) -> None:
        self.calls.append(("load", name, path))

    def abort(self, request_id: str, index: int | None = None) -> None:
        self.calls.append(("abort", request_id))

    def _forget(self, request_id: str) -> None:
        self.calls.append(("forget", request_id))


def _engine(cores: list[FakeCore]) -> DataParallelEngine:
    engine = object.__new__(DataParallelEngine)  # the cores alone: no processes
    engine.cores, engine._owners = cores, {}  # type: ignore[assignment]
    return engine


def test_stats_are_summed_adapters_go_to_every_live_core_and_aborts_to_the_owner() -> None:
    one = FakeCore(EngineStats(running=2, kv_blocks_total=100, kv_tokens_per_block=16, iterations=5,
                               lora_requests={"a": 1}))
    two = FakeCore(EngineStats(running=3, kv_blocks_total=100, kv_tokens_per_block=16, iterations=7,
                               lora_requests={"a": 2, "b": 1}))
    dead = FakeCore(EngineStats(), ready=False)
    engine = _engine([one, two, dead])
    stats = engine.stats()
    assert (stats.running, stats.kv_blocks_total, stats.iterations) == (5, 200, 12)
    assert stats.kv_tokens_per_block == 16 and stats.lora_requests == {"a": 3, "b": 1}
    asyncio.run(engine.load_lora_adapter("x", "/adapters/x"))
    assert one.calls == two.calls == [("load", "x", "/adapters/x")] and dead.calls == []
    engine._owners["r"] = (1, GenerationRequest("r", prompt_token_ids=[1]))
    engine.abort("r")
    engine.abort("unknown")
    assert two.calls[-1] == ("abort", "r") and len(one.calls) == 1
    assert engine.degraded == "engine core 2: exited (exit code -9)"


def test_metrics_label_each_cores_figures_and_show_the_dead_one_down() -> None:
    """/metrics as an operator reads it: each core's up, queued tokens, requests and KV blocks under core="i"; the
    dead core is up 0 with nothing held; the unlabelled families stay the live cores' sums."""
    loaded = FakeCore(EngineStats(running=3, waiting=2, kv_blocks_total=100, kv_blocks_used=60, kv_blocks_free=40))
    idle = FakeCore(EngineStats(running=0, kv_blocks_total=100, kv_blocks_free=100))
    dead = FakeCore(EngineStats(running=4, kv_blocks_total=100, kv_blocks_used=90), ready=False)  # its last figures
    engine = _engine([loaded, idle, dead])
    engine.router = Router(3, block_size=4)
    engine.router.pick("a", [1, 2, 3], 7)  # 10 tokens on core 0
    engine.router.pick("b", [4, 5], 3)  # 5 on core 1
    metrics = GatewayMetrics()
    metrics.watch_engine(engine)
    samples = {(sample.name, tuple(sample.labels.items())): sample.value
               for family in text_string_to_metric_families(metrics.exposition().decode())
               for sample in family.samples}

    def per_core(name: str) -> list[float]:
        return [samples[("trtllm_gateway_engine_core_" + name, (("core", str(core)),))] for core in range(3)]

    assert per_core("up") == [1, 1, 0]
    assert per_core("queued_tokens") == [10, 5, 0]
    assert per_core("requests_running") == [3, 0, 0] and per_core("requests_waiting") == [2, 0, 0]
    assert per_core("kv_blocks_used") == [60, 0, 0] and per_core("kv_blocks_free") == [40, 100, 0]
    assert per_core("kv_blocks_total") == [100, 100, 0]
    assert samples[("trtllm_gateway_requests_running", ())] == 3
    assert samples[("trtllm_gateway_kv_blocks_total", ())] == 200


def test_a_consumer_that_leaves_early_has_its_request_ended_in_its_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client went away mid-stream: the request's core is told (through _forget, as AsyncEngine's reader does
    when it is closed early), while the engine still knows which core owns it."""
    async def one_core_stream(self: DataParallelEngine, request: GenerationRequest) -> AsyncIterator[list[Any]]:
        self._owners[request.request_id] = (1, request)  # what _add records
        self.router.pick(request.request_id, [1, 2, 3], 8)
        try:
            yield ["first"]
            yield ["second"]
        finally:
            self._forget(request.request_id)  # AsyncEngine's read_batches on an early close

    monkeypatch.setattr(AsyncEngine, "generate_batches", one_core_stream)
    cores = [FakeCore(EngineStats()), FakeCore(EngineStats())]
    engine = _engine(cores)
    engine.router = Router(2, block_size=4)

    async def leave_after_the_first_batch() -> None:
        batches = engine.generate_batches(GenerationRequest("r", prompt_token_ids=[1, 2, 3]))
        assert await batches.__anext__() == ["first"]
        await batches.aclose()

    asyncio.run(leave_after_the_first_batch())
    assert cores[1].calls == [("forget", "r")] and engine._owners == {} and engine.router.queued == [0, 0]


def test_a_refused_duplicate_id_leaves_the_running_request_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second request under a running request's id is refused; the first keeps its core and its queued tokens."""
    async def through_add(self: DataParallelEngine, request: GenerationRequest) -> AsyncIterator[list[Any]]:
        await self._add(request, None)  # type: ignore[arg-type]  (refused before the prepared request is read)
        yield []

    monkeypatch.setattr(AsyncEngine, "generate_batches", through_add)
    engine = _engine([FakeCore(EngineStats()), FakeCore(EngineStats())])
    engine.router = Router(2, block_size=4)
    running = GenerationRequest("r", prompt_token_ids=[1, 2, 3])
    engine._owners["r"] = (1, running)
    engine.router.pick("r", [1, 2, 3], 8)

    async def duplicate() -> None:
        with pytest.raises(InvalidRequestError, match="already running"):
            async for _ in engine.generate_batches(GenerationRequest("r", prompt_token_ids=[4])):
                pass

    asyncio.run(duplicate())
    assert engine._owners == {"r": (1, running)} and engine.router.queued == [11, 0]
