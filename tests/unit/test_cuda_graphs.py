"""CUDA graph buckets (CPU logic), and the engine with graphs vs without (CUDA only)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from runtime.native.cuda.graphs import graph_batch_sizes, pick_bucket
from runtime.native.cuda.prefill_graphs import prefill_bucket_sizes
from runtime.request import TokenLogprob


def test_batch_sizes_cover_every_batch_with_bounded_padding() -> None:
    sizes = graph_batch_sizes(256)
    assert sizes[:5] == [1, 2, 3, 4, 8] and sizes[-1] == 256 and sizes == sorted(set(sizes))
    for batch in range(1, 257):
        bucket = pick_bucket(sizes, batch)
        assert bucket is not None and bucket >= batch
        assert bucket - batch < max(8, batch // 4)  # padding waste stays small
    assert pick_bucket(sizes, 257) is None


def test_batch_sizes_end_at_the_max_batch_size() -> None:
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(5) == [1, 2, 3, 4, 5]
    assert graph_batch_sizes(64)[-2:] == [56, 64]
    assert graph_batch_sizes(100)[-3:] == [80, 96, 100]


def test_prefill_buckets_cover_every_length_with_at_most_half_padding() -> None:
    sizes = prefill_bucket_sizes(4096)
    assert sizes == [32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]
    for n in range(18, 4097):  # fewer tokens go to the decode graphs
        bucket = pick_bucket(sizes, n)
        assert bucket is not None and n <= bucket <= max(32, 1.5 * n)
    assert prefill_bucket_sizes(2000)[-2:] == [1536, 2000] and prefill_bucket_sizes(64) == [32, 48, 64]


def test_mixed_buckets_are_the_powers_of_two_of_both() -> None:
    from runtime.native.cuda.mixed_graphs import mixed_buckets

    assert mixed_buckets(graph_batch_sizes(64), prefill_bucket_sizes(4096)) == ([1, 2, 4, 8, 16, 32, 64],
                                                                                [32, 64, 128, 256, 512])
    assert mixed_buckets(graph_batch_sizes(100), prefill_bucket_sizes(400)) == ([1, 2, 4, 8, 16, 32, 64, 100],
                                                                               [32, 64, 128, 256, 400])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("max_num_tokens", [2048, 64], ids=["whole-prompts", "chunked"])
def test_graphed_engine_matches_eager_engine(max_num_tokens: int) -> None:
    """Decode and prefill graphs against eager steps: concurrent requests, then prompts of many lengths one at a
    time (each prefill a graph's, or with 64 tokens a step chunks of up to 64 over the cache), some continuing a
    cached prefix."""
    from runtime.config import EngineConfig
    from runtime.native.llm_engine import NativeEngine
    from runtime.request import GenerationRequest, SamplingOptions

    prompts = ["Once upon a time" + " there" * i for i in range(5)]
    lone = ["Once upon a time" + " the little cat sat" * i for i in (5, 9, 30, 9)]  # the last: a prefix cache hit

    async def run(graphs: bool) -> list[list[int]]:
        engine = NativeEngine(EngineConfig(model="demo", device="cuda", dtype="float32", max_batch_size=8,
                                           max_kv_tokens=4096, max_num_tokens=max_num_tokens,
                                           enable_cuda_graphs=graphs))
        await engine.start()
        try:
            async def one(i: int, prompt: str) -> list[int]:
                req = GenerationRequest(f"r{i}", prompt=prompt,
                                        sampling=SamplingOptions(max_tokens=24, temperature=0.0, ignore_eos=True))
                return [t for d in [d async for d in engine.generate(req)] for t in d.token_ids]
            together = list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
            return together + [await one(100 + i, p) for i, p in enumerate(lone)]
        finally:
            await engine.shutdown()

    assert asyncio.run(run(True)) == asyncio.run(run(False))


def same_greedy_up_to_a_tie(ours: list[TokenLogprob], reference: list[TokenLogprob], tie: float = 1e-3) -> bool:
    """The same chosen ids, or the same up to a position where both runs' best two candidates lie within `tie`
    (in logprob) of each other: a near-tie, which other kernels summing in another order may break either way."""
    for a, b in zip(ours, reference):
        if a.token_id != b.token_id:
            return all(len(t.top) > 1 and t.top[0][1] - t.top[1][1] < tie for t in (a, b))
    return len(ours) == len(reference)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prompts_joining_decode_rows_replay_graphs_and_match_eager_steps() -> None:
    """Four streams of requests of different lengths, so that prompts (47-119 tokens) join steps of decode rows:
    with graphs every step is replayed (a decode graph, a prefill graph for up to 8 prompts, or a mixed graph of
    both), none runs op by op, and the greedy ids equal those of the engine without graphs. The two engines
    compose their steps differently (timing), and a decode row attends with another kernel than in an op-by-op
    mixed step, so a near-tie may go either way (the demo model alternates between two tokens, and one run of
    eight differed there): the ids are compared up to such a tie."""
    from runtime.config import EngineConfig
    from runtime.native.llm_engine import NativeEngine
    from runtime.request import GenerationRequest, SamplingOptions

    prompts = ["Once upon a time" + " the little cat sat" * i for i in (5, 9, 14, 7, 11, 6, 8, 12)]

    async def run(graphs: bool) -> tuple[list[list[TokenLogprob]], int]:
        engine = NativeEngine(EngineConfig(model="demo", device="cuda", dtype="float32", max_batch_size=8,
                                           max_kv_tokens=4096, enable_cuda_graphs=graphs))
        await engine.start()
        try:
            async def stream(s: int) -> list[list[TokenLogprob]]:
                out = []
                for j in range(2):
                    req = GenerationRequest(f"r{s}-{j}", prompt=prompts[2 * s + j], sampling=SamplingOptions(
                        max_tokens=6 + 5 * s + 3 * j, temperature=0.0, ignore_eos=True, logprobs=2))
                    out.append([t for d in [d async for d in engine.generate(req)] for t in d.logprobs or []])
                return out
            tokens = [r for rs in await asyncio.gather(*(stream(s) for s in range(4))) for r in rs]
            return tokens, engine.stats().eager_iterations
        finally:
            await engine.shutdown()

    (graphed, eager_steps), (reference, _) = asyncio.run(run(True)), asyncio.run(run(False))
    assert eager_steps == 0
    assert [len(t) for t in graphed] == [6, 9, 11, 14, 16, 19, 21, 24]
    assert all(same_greedy_up_to_a_tie(a, b) for a, b in zip(graphed, reference))


def test_one_row_per_token_gives_the_packed_step_logits(tmp_path) -> None:
    """What a graphed verify step computes (every new token a one-token row over the cache, with its
    own length) equals the eager multi-token step, for two sequences continuing their caches."""
    from runtime.native.cuda.graphs import row_metadata
    from runtime.native.decode_rows import pack_rows
    from runtime.native.model_runner import ModelRunner
    from runtime.native.models import load_model
    from runtime.native.sampler import Sampler
    from runtime.native.step_inputs import StepInput, StepInputs
    from tests.tiny_models import build_tiny_model

    bs = 4
    model = load_model(str(build_tiny_model(tmp_path, "llama")), torch.float32, torch.device("cpu"))
    runner = ModelRunner(model, bs, Sampler(0))
    runner.allocate_kv_cache(16)
    runner.execute([StepInput(list(range(3, 9)), 0, [0, 1]), StepInput(list(range(40, 43)), 0, [2])])
    step = [StepInput([9, 10, 11, 12, 13], 6, [0, 1, 3], return_all_logits=True),
            StepInput([50, 51], 3, [2, 4], return_all_logits=True)]
    eager = torch.cat([r.all_logits for r in runner.execute(step)])

    columns, tables = pack_rows(StepInputs.of(step), bs)
    assert columns[1].tolist() == [6, 7, 8, 9, 10, 3, 4] and columns[3].tolist() == [7, 8, 9, 10, 11, 4, 5]
    assert columns[2].tolist() == [6, 7, 12, 13, 14, 11, 16] and tables[-1].tolist() == [2, 4, 0]
    assert columns[5].tolist() == [-1] * 7  # no token pending from a previous step
    packed = torch.from_numpy(columns)
    meta = row_metadata(packed, torch.from_numpy(tables), torch.arange(8, dtype=torch.int32), bs,
                        3 * bs)
    with torch.inference_mode():
        rows = model.compute_logits(model(packed[0], packed[1], runner.kv_caches, meta))
    torch.testing.assert_close(rows, eager, rtol=1e-5, atol=1e-5)
