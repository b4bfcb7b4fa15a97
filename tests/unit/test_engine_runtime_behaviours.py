"""The runtime behaviours the Triton TensorRT-LLM backend documented, on NativeEngine:
both scheduler policies under KV pressure, KV cache (prefix) reuse, chunked context."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import torch

from runtime.request import GenerationRequest
from tests.engine_harness import Collected, StepRecorder, collect, hf_greedy, load_hf, request, running_engine
from tests.tiny_models import build_tiny_model

BLOCK = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = build_tiny_model(tmp_path_factory.mktemp("behaviours"), "llama")
    return path, load_hf(path)


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 300) for _ in range(n)]


# six requests, greedy and seeded-sampled, one with n=2: 6 + 14 + ... blocks, far more than 16 at once
PRESSURE = [
    (tokens(6, 10), 30, {}),
    (tokens(9, 11), 24, {"temperature": 0.8, "seed": 3}),
    (tokens(12, 12), 28, {}),
    (tokens(5, 13), 20, {"temperature": 1.0, "top_k": 30, "seed": 4, "n": 2}),
    (tokens(10, 14), 26, {}),
    (tokens(8, 15), 22, {"temperature": 0.7, "seed": 5}),
]


def pressure_requests() -> list[GenerationRequest]:
    return [request(f"p{i}", p, m, **kw) for i, (p, m, kw) in enumerate(PRESSURE)]


async def run_all(engine, reqs: list[GenerationRequest]) -> dict[str, Collected]:
    outs = await asyncio.gather(*(collect(engine, r) for r in reqs))
    return {r.request_id: o for r, o in zip(reqs, outs)}


@pytest.fixture(scope="module")
def unpressured(model) -> dict[str, Collected]:
    path, _ = model

    async def go() -> dict[str, Collected]:
        async with running_engine(path, max_model_len=64, max_kv_tokens=4096) as engine:
            return await run_all(engine, pressure_requests())

    return asyncio.run(go())


def worst_case_blocks(i: int) -> int:
    prompt, max_tokens, kw = PRESSURE[i]
    return kw.get("n", 1) * -(-(len(prompt) + max_tokens) // BLOCK)


@pytest.mark.parametrize("policy", ["max_utilization", "guaranteed_no_evict"])
async def test_kv_pressure_loses_no_request_and_changes_no_output(model, unpressured, policy: str) -> None:
    path, hf = model
    # 16 blocks of 4 tokens: one request's worst case fits, all six together need 6x as many
    async with running_engine(path, max_model_len=64, max_kv_tokens=64, scheduler_policy=policy) as engine:
        rec = StepRecorder(engine)
        outs = await run_all(engine, pressure_requests())
        stats = engine.stats()
    for i, (prompt, max_tokens, kw) in enumerate(PRESSURE):
        rid = f"p{i}"
        n = kw.get("n", 1)
        assert outs[rid].tokens == unpressured[rid].tokens, rid
        assert outs[rid].finish == {j: "length" for j in range(n)}
        assert outs[rid].usage.completion_tokens == n * max_tokens
        if not kw:
            assert outs[rid].tokens[0] == hf_greedy(hf, prompt, max_tokens)
    assert stats.kv_blocks_used == 0 and stats.running == stats.waiting == stats.paused == 0
    assert max(rec.used_blocks) <= 16

    if policy == "max_utilization":
        assert stats.preemptions > 0 and max(st.paused for st in rec.stats) > 0
        # a paused request resumed: after decoding it was prefilled again from position 0
        resumed = [rid for rid in outs if any(
            e.is_prefill and e.start == 0 and any(not d.is_prefill for j, d in rec.of(rid) if j < i)
            for i, e in rec.of(rid))]
        assert resumed
        # packing: more requests ran side by side than their worst cases would allow
        assert any(sum(worst_case_blocks(int(r[1:])) for r in {e.request_id for e in step}) > 16
                   for step in rec.steps)
    else:
        assert stats.preemptions == 0 and max(st.paused for st in rec.stats) == 0
        assert max(st.waiting for st in rec.stats) > 0  # held back, not dropped
        # admitted only when every admitted request's whole generation fits
        for step in rec.steps:
            assert sum(worst_case_blocks(int(r[1:])) for r in {e.request_id for e in step}) <= 16


async def test_prefix_reuse_prefills_a_shared_prompt_once(model) -> None:
    path, hf = model
    system = tokens(40, 20)  # 10 full blocks
    first, second, third = system + tokens(5, 21), system + tokens(6, 22), system[:23] + tokens(4, 23)
    async with running_engine(path) as engine:
        a = await collect(engine, request("a", first, 8))
        s1 = engine.stats()
        b = await collect(engine, request("b", second, 8))
        s2 = engine.stats()
        c = await collect(engine, request("c", third, 8))  # shares 5 full blocks, then diverges
        s3 = engine.stats()
    for out, prompt in ((a, first), (b, second), (c, third)):
        assert out.tokens[0] == hf_greedy(hf, prompt, 8)
    assert (s1.prefill_tokens_computed, s1.prefix_cache_hit_tokens, a.usage.cached_tokens) == (45, 0, 0)
    assert s2.prefill_tokens_computed - s1.prefill_tokens_computed == 6
    assert s2.prefix_cache_hit_tokens - s1.prefix_cache_hit_tokens == 40 == b.usage.cached_tokens
    assert s3.prefill_tokens_computed - s2.prefill_tokens_computed == 27 - 20
    assert s3.prefix_cache_hit_tokens - s2.prefix_cache_hit_tokens == 20 == c.usage.cached_tokens
    assert s3.prompt_tokens_total == 45 + 46 + 27

    async with running_engine(path, enable_prefix_caching=False) as engine:
        await collect(engine, request("a", first, 8))
        b2 = await collect(engine, request("b", second, 8))
        s = engine.stats()
    assert b2.tokens == b.tokens and b2.usage.cached_tokens == 0
    assert (s.prefill_tokens_computed, s.prefix_cache_hit_tokens) == (45 + 46, 0)


async def test_chunked_context_interleaves_with_decodes_and_changes_nothing(model) -> None:
    path, hf = model
    short, long = tokens(4, 30), tokens(50, 31)
    async with running_engine(path, max_num_tokens=8) as engine:
        rec = StepRecorder(engine)
        started = asyncio.Event()
        decoding = asyncio.create_task(collect(engine, request("short", short, 40), started=started))
        await started.wait()
        chunked = await collect(engine, request("long", long, 10))
        await decoding
    chunks = [(i, e) for i, e in rec.of("long") if e.is_prefill]
    assert sum(e.num_new_tokens for _, e in chunks) == 50
    assert len(chunks) >= 7 and all(e.num_new_tokens <= 7 for _, e in chunks)
    assert [e.start for _, e in chunks] == [sum(c.num_new_tokens for _, c in chunks[:k]) for k in range(len(chunks))]
    # every chunk ran in a step that also decoded the short request: its stream never stalled
    short_decode_steps = {i for i, e in rec.of("short") if not e.is_prefill}
    assert all(i in short_decode_steps for i, _ in chunks)
    assert chunked.tokens[0] == hf_greedy(hf, long, 10)
    assert (await decoding).tokens[0] == hf_greedy(hf, short, 40)

    async with running_engine(path, max_num_tokens=64, enable_chunked_prefill=False) as engine:
        whole = await collect(engine, request("long", long, 10))
    assert whole.tokens == chunked.tokens
