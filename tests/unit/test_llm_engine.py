"""NativeEngine driven directly: greedy ids equal transformers' `generate` (alone and in a batch of requests
joining at different steps), n > 1 sharing prompt blocks, seeds independent of batch companions, aborts
freeing KV blocks, queue and context-window limits, exact usage."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import torch

from runtime.errors import PromptTooLongError, QueueFullError
from runtime.request import GenerationRequest, SamplingOptions
from tests.engine_harness import StepRecorder, collect, hf_greedy, load_hf, request, running_engine, wait_for
from tests.tiny_models import build_tiny_model

ARCHS = ("llama", "qwen2", "gpt2")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.nn.Module]]:
    root = tmp_path_factory.mktemp("engine")
    out = {}
    for arch in ARCHS:
        path = build_tiny_model(root, arch)
        out[arch] = (path, load_hf(path))
    return out


def prompts(count: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 300) for _ in range(n)] for n in lengths[:count]]


@pytest.mark.parametrize("arch", ARCHS)
async def test_greedy_alone_matches_transformers(models, arch: str) -> None:
    path, hf = models[arch]
    async with running_engine(path) as engine:
        for i, prompt in enumerate(prompts(2, [5, 14], seed=1)):
            out = await collect(engine, request(f"r{i}", prompt, 20))
            assert out.tokens[0] == hf_greedy(hf, prompt, 20)
            assert out.finish == {0: "length"}


@pytest.mark.parametrize("arch", ARCHS)
async def test_greedy_batch_of_8_joining_at_different_steps_matches_transformers(models, arch: str) -> None:
    path, hf = models[arch]
    lengths = [3, 30, 8, 11, 13, 22, 5, 17]
    max_tokens = [32, 28, 30, 20, 16, 18, 12, 14]
    ps = prompts(8, lengths, seed=2)
    groups = [(0, 1, 2), (3, 4, 5), (6, 7)]  # each group joins once the previous one produced tokens
    # max_num_tokens 16 < the 22- and 30-token prompts: those are prefilled in chunks beside decodes
    async with running_engine(path, max_num_tokens=16) as engine:
        rec = StepRecorder(engine)
        tasks: dict[int, asyncio.Task] = {}
        for group in groups:
            events = []
            for i in group:
                ev = asyncio.Event()
                tasks[i] = asyncio.create_task(collect(engine, request(f"r{i}", ps[i], max_tokens[i]),
                                                       started=ev, after_tokens=3))
                events.append(ev)
            await asyncio.gather(*(ev.wait() for ev in events))
        outs = {i: await t for i, t in tasks.items()}
    for i in range(8):
        assert outs[i].tokens[0] == hf_greedy(hf, ps[i], max_tokens[i]), f"request {i}"
        assert outs[i].usage.prompt_tokens == lengths[i] and outs[i].usage.completion_tokens == max_tokens[i]
    # the batching really happened: later requests' prompts ran in steps that also decoded earlier ones
    first_step = {i: rec.of(f"r{i}")[0][0] for i in range(8)}
    for late in (3, 4, 5, 6, 7):
        step = rec.steps[first_step[late]]
        assert any(not e.is_prefill for e in step), f"r{late} joined a step without decodes"
    assert max(len(s) for s in rec.steps) >= 4
    chunks = [e.num_new_tokens for _, e in rec.of("r1") if e.is_prefill]
    assert sum(chunks) == 30 and len(chunks) >= 2


async def test_n_samples_share_the_prompt_blocks(models) -> None:
    path, hf = models["llama"]
    prompt = prompts(1, [18], seed=3)[0]  # 4 full blocks of 4 plus a partial one
    async with running_engine(path) as engine:
        rec = StepRecorder(engine)
        out = await collect(engine, request("n3", prompt, 6, n=3))
        stats = engine.stats()
    ref = hf_greedy(hf, prompt, 6)
    assert out.tokens == {0: ref, 1: ref, 2: ref}
    assert out.usage.prompt_tokens == 18 and out.usage.completion_tokens == 18
    # the prompt was prefilled once, not once per sample
    assert rec.prefill_tokens("n3") == 18 and stats.prefill_tokens_computed == 18
    after_fork = [e for e in rec.steps[1]]
    assert sorted(e.index for e in after_fork) == [0, 1, 2]
    tables = [e.block_table for e in after_fork]
    assert tables[0][:4] == tables[1][:4] == tables[2][:4]  # full prompt blocks shared
    assert len({t[4] for t in tables}) == 3  # the partial block was copied on write
    assert rec.used_blocks[1] == 4 + 3


async def test_seeded_request_is_reproducible_whatever_its_batch_companions(models) -> None:
    path, _ = models["llama"]
    ps = prompts(6, [9, 4, 15, 7, 20, 12], seed=4)

    def seeded(rid: str, seed: int = 1234, n: int = 1) -> GenerationRequest:
        return request(rid, ps[0], 16, temperature=0.9, top_k=40, seed=seed, n=n)

    async with running_engine(path) as engine:
        alone = (await collect(engine, seeded("alone"))).tokens[0]
        again = (await collect(engine, seeded("again"))).tokens[0]
        other_seed = (await collect(engine, seeded("other", seed=99))).tokens[0]
        companions = [
            request("c1", ps[1], 24, temperature=1.0),  # unseeded: the shared generator
            request("c2", ps[2], 24, temperature=0.7, seed=5),
            request("c3", ps[3], 24),  # greedy
            request("c4", ps[4], 24, temperature=1.2, top_p=0.9, n=2),
            request("c5", ps[5], 24, temperature=0.9, top_k=40, seed=1234),  # same seed, other prompt
        ]
        started = [asyncio.Event() for _ in companions]
        tasks = [asyncio.create_task(collect(engine, r, started=ev, after_tokens=2))
                 for r, ev in zip(companions, started)]
        await asyncio.gather(*(ev.wait() for ev in started))
        in_batch = (await collect(engine, seeded("batched"))).tokens[0]
        as_sample = (await collect(engine, seeded("n2", n=2))).tokens
        await asyncio.gather(*tasks)
    assert alone == again == in_batch
    assert as_sample[0] == alone  # sample 0 of n=2 draws from the same stream as n=1
    assert alone != other_seed and as_sample[1] != alone


async def test_abort_frees_kv_blocks(models) -> None:
    path, hf = models["llama"]
    p = prompts(3, [10, 6, 9], seed=5)
    async with running_engine(path, max_batch_size=2) as engine:
        gen = engine.generate(request("long", p[0], 200))
        first = await gen.__anext__()
        assert first.token_ids and engine.stats().kv_blocks_used > 0
        engine.abort("long")
        rest = [d async for d in gen]
        assert rest[-1].finish_reason == "abort" and rest[-1].usage.prompt_tokens == 10
        assert rest[-1].usage.completion_tokens == 1 + sum(len(d.token_ids) for d in rest) < 200

        # a consumer that leaves early (client gone) aborts too
        gen = engine.generate(request("gone", p[1], 200))
        await gen.__anext__()
        await gen.aclose()
        await wait_for(lambda: engine.stats().running == 0 and engine.stats().kv_blocks_used == 0)

        # aborting a request that waits for a batch slot leaves the running ones untouched
        started = asyncio.Event()
        t1 = asyncio.create_task(collect(engine, request("a", p[2], 30), started=started))
        t2 = asyncio.create_task(collect(engine, request("b", p[0], 30), started=started))
        await started.wait()
        waiting = asyncio.create_task(collect(engine, request("w", p[1], 30)))
        await wait_for(lambda: engine.stats().waiting == 1)
        engine.abort("w")
        w = await waiting
        assert w.finish == {0: "abort"} and w.tokens == {0: []} and w.usage.completion_tokens == 0
        assert (await t1).tokens[0] == hf_greedy(hf, p[2], 30)
        assert (await t2).tokens[0] == hf_greedy(hf, p[0], 30)
        await wait_for(lambda: engine.stats().kv_blocks_used == 0)
        stats = engine.stats()
        assert (stats.running, stats.waiting, stats.paused) == (0, 0, 0)
        assert stats.kv_blocks_free == stats.kv_blocks_total
        engine.block_manager.check_invariants([])


async def test_queue_full_is_a_typed_error(models) -> None:
    path, _ = models["llama"]
    p = prompts(1, [6], seed=6)[0]
    async with running_engine(path, max_batch_size=1, max_queue_size=2) as engine:
        running = engine.generate(request("run", p, 200))
        await running.__anext__()  # "run" holds the only batch slot
        queued = [engine.generate(request(f"q{i}", p, 4)) for i in range(2)]
        pending = [asyncio.ensure_future(g.__anext__()) for g in queued]
        await wait_for(lambda: engine.stats().waiting == 2)
        with pytest.raises(QueueFullError, match="queue is full"):
            await engine.generate(request("over", p, 4)).__anext__()
        await running.aclose()
        for fut, g in zip(pending, queued):
            assert (await fut).token_ids
            assert [d async for d in g][-1].usage.completion_tokens == 4


async def test_prompt_too_long_names_both_numbers(models) -> None:
    path, _ = models["llama"]
    async with running_engine(path) as engine:  # context window: the tiny model's 256 positions
        with pytest.raises(PromptTooLongError) as err:
            await engine.generate(request("x", [5] * 250, 10)).__anext__()
        assert (err.value.prompt_tokens, err.value.max_tokens, err.value.context_window) == (250, 10, 256)
        assert err.value.param == "max_tokens" and "260 tokens" in err.value.message
        # max_tokens unset: up to the window (the default of 2048 is past it), "length" at exactly 256 tokens
        req = GenerationRequest("fill", prompt_token_ids=[5] * 250,
                                sampling=SamplingOptions(temperature=0.0, ignore_eos=True))
        out = await collect(engine, req)
        assert out.usage.completion_tokens == 6 and out.finish == {0: "length"}
        await wait_for(lambda: engine.stats().kv_blocks_used == 0)


async def test_requests_without_max_tokens_stop_at_the_default(models) -> None:
    """EngineConfig.default_max_tokens: a request that sets no max_tokens generates that many, or what the context
    window has room for when that is less; one that sets it is not held to it."""
    path, _ = models["llama"]
    async with running_engine(path, default_max_tokens=12) as engine:
        unset = SamplingOptions(temperature=0.0, ignore_eos=True)
        for prompt, generated in (([5] * 20, 12), ([5] * 250, 6)):
            out = await collect(engine, GenerationRequest(f"p{len(prompt)}", prompt_token_ids=prompt, sampling=unset))
            assert out.usage.completion_tokens == generated and out.finish == {0: "length"}
        out = await collect(engine, request("set", [5] * 20, 30))
        assert out.usage.completion_tokens == 30


async def test_exact_usage_with_stop_token_and_text_prompt(models) -> None:
    path, hf = models["qwen2"]
    prompt = prompts(1, [12], seed=7)[0]
    ref = hf_greedy(hf, prompt, 20)
    k = next(i for i in range(3, 20) if ref[i] not in ref[:i])  # first fresh token at or after position 3
    async with running_engine(path) as engine:
        out = await collect(engine, request("stop", prompt, 20, stop_token_ids=[ref[k]]))
        assert out.tokens[0] == ref[: k + 1]  # the stop token is in the ids and counted
        assert out.finish == {0: "stop"} and out.stop_reason == {0: ref[k]}
        assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (12, k + 1, 13 + k)

        text = "Hello, world! the cat sat"
        n_prompt = len(engine.tokenizer.encode(text))
        req = GenerationRequest("text", prompt=text, sampling=SamplingOptions(max_tokens=7, temperature=0.0,
                                                                              ignore_eos=True, n=2))
        out = await collect(engine, req)
        assert out.usage.prompt_tokens == n_prompt and out.usage.completion_tokens == 14
        assert out.deltas[0].prompt_token_ids == engine.tokenizer.encode(text)
        assert [d.usage is not None for d in out.deltas].count(True) == 1 and out.deltas[-1].usage is not None


async def test_stats_describe_every_step_for_the_triton_metrics(models) -> None:
    path, _ = models["gpt2"]
    ps = prompts(3, [10, 25, 6], seed=8)
    async with running_engine(path, max_num_tokens=12, max_batch_size=2, max_kv_tokens=512) as engine:
        rec = StepRecorder(engine)
        before = engine.stats()
        outs = await asyncio.gather(*(collect(engine, request(f"s{i}", p, 5)) for i, p in enumerate(ps)))
        await wait_for(lambda: engine.stats().iterations == len(rec.steps))
        after = engine.stats()
    assert (before.max_batch_size, before.max_num_tokens) == (2, 12)
    assert (before.kv_blocks_total, before.kv_blocks_free, before.kv_blocks_used, before.kv_tokens_per_block) == (128, 128, 0, 4)
    memory = "gpu" if engine.device.type == "cuda" else "cpu"  # where the weights and the KV cache live
    assert before.iterations == 0 and before.memory_bytes[memory] > 0
    for i, (step, st) in enumerate(zip(rec.steps, rec.stats)):
        context = [e for e in step if e.is_prefill]
        assert st.iterations == i + 1
        if memory == "cpu":  # the tests compile no CPU steps: every step runs op by op
            assert st.eager_iterations == i + 1
        assert st.scheduled == len({e.request_id for e in step}) <= 2
        assert st.context_requests == len({e.request_id for e in context})
        assert st.generation_requests == len({e.request_id for e in step if not e.is_prefill})
        assert st.context_tokens == sum(e.num_new_tokens for e in context) <= 12
        assert st.kv_blocks_used + st.kv_blocks_free == 128 and 0 < rec.used_blocks[i] <= 128
        assert st.running + st.waiting + st.paused <= 3 and st.running <= 2
    assert max(st.waiting for st in rec.stats) >= 1  # the third request waited for a batch slot
    assert after.prompt_tokens_total == after.prefill_tokens_computed == 41
    assert after.generation_tokens_total == 15 == sum(o.usage.completion_tokens for o in outs)
    assert (after.running, after.waiting, after.paused, after.kv_blocks_used) == (0, 0, 0, 0)


async def test_non_streamed_request_is_handed_over_once_with_the_same_output(models) -> None:
    path, hf = models["llama"]
    p = prompts(1, [7], seed=11)[0]
    async with running_engine(path) as engine:
        streamed = request("s", p, 12, ignore_eos=True)
        held = request("h", p, 12, ignore_eos=True)
        held.stream = False
        # step-by-step: a batch per step is handed over; held: all 12 tokens in one batch, at the end
        s_batches = [b async for b in engine.generate_batches(streamed)]
        h_batches = [b async for b in engine.generate_batches(held)]
    assert len(h_batches) == 1 and len(s_batches) > 1
    s_deltas, h_deltas = [d for b in s_batches for d in b], h_batches[0]
    assert [t for d in h_deltas for t in d.token_ids] == [t for d in s_deltas for t in d.token_ids] == hf_greedy(hf, p, 12)
    assert h_deltas[-1].usage.prompt_tokens == s_deltas[-1].usage.prompt_tokens == 7
    assert h_deltas[-1].usage.completion_tokens == s_deltas[-1].usage.completion_tokens == 12
    # each delta keeps the time the engine produced it, so time-to-first-token stays measurable
    times = [d.time for d in h_deltas]
    assert all(t is not None for t in times) and times == sorted(times) and times[0] < times[-1]


async def test_a_stream_interval_hands_tokens_over_in_groups_after_the_first(models) -> None:
    path, hf = models["llama"]
    p = prompts(1, [7], seed=12)[0]
    async with running_engine(path, stream_interval=4) as engine:
        handed: list[tuple[str, int, bool]] = []  # (request, tokens in the hand-off, final) per hand-off
        send = engine.outbox.send

        def recording_send(pending):
            handed.extend((state.request_id, sum(len(d.token_ids) for d in ds), final) for state, ds, final in pending)
            send(pending)

        engine.outbox.send = recording_send
        one = await collect(engine, request("one", p, 11))
        two = await collect(engine, request("two", p, 11, n=2, temperature=1.0, seed=3))
        held = request("held", p, 11)
        held.stream = False
        whole = await collect(engine, held)
    assert one.tokens[0] == whole.tokens[0] == hf_greedy(hf, p, 11)
    assert one.usage.completion_tokens == 11 and two.usage.completion_tokens == 22
    # the first token at once, then 4 per sequence, then the rest with the finish
    assert [(n, final) for rid, n, final in handed if rid == "one"] == [(1, False), (4, False), (4, False), (2, True)]
    assert [(n, final) for rid, n, final in handed if rid == "two"] == [(2, False), (8, False), (8, False), (4, True)]
    assert [(n, final) for rid, n, final in handed if rid == "held"] == [(11, True)]  # not streamed: held whole

