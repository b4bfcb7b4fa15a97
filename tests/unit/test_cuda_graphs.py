"""CUDA graph buckets (CPU logic), and the engine with graphs vs without (CUDA only)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from runtime.cuda.graphs import graph_batch_sizes, pick_bucket


def test_batch_sizes_cover_every_batch_with_bounded_padding() -> None:
    sizes = graph_batch_sizes(256)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 256 and sizes == sorted(set(sizes))
    for batch in range(1, 257):
        bucket = pick_bucket(sizes, batch)
        assert bucket is not None and bucket >= batch
        assert bucket - batch < max(8, batch // 4)  # padding waste stays small
    assert pick_bucket(sizes, 257) is None


def test_batch_sizes_end_at_the_max_batch_size() -> None:
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(5) == [1, 2, 4, 5]
    assert graph_batch_sizes(64)[-2:] == [56, 64]
    assert graph_batch_sizes(100)[-3:] == [80, 96, 100]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_engine_matches_eager_engine() -> None:
    from runtime.config import EngineConfig
    from runtime.llm_engine import NativeEngine
    from runtime.request import GenerationRequest, SamplingOptions

    async def run(graphs: bool) -> list[list[int]]:
        engine = NativeEngine(EngineConfig(device="cuda", dtype="float32", max_batch_size=8, max_kv_tokens=4096,
                                           enable_cuda_graphs=graphs))
        await engine.start()
        try:
            async def one(i: int) -> list[int]:
                req = GenerationRequest(f"r{i}", prompt="Once upon a time" + " there" * i,
                                        sampling=SamplingOptions(max_tokens=24, temperature=0.0, ignore_eos=True))
                return [t for d in [d async for d in engine.generate(req)] for t in d.token_ids]
            return list(await asyncio.gather(*(one(i) for i in range(5))))
        finally:
            await engine.shutdown()

    assert asyncio.run(run(True)) == asyncio.run(run(False))
