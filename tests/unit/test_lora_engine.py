"""LoRA through NativeEngine: greedy ids equal transformers + PEFT on the same base and adapter, alone
and in one batch mixing several adapters and the base model; TensorRT-LLM-format (Triton) tasks;
prefix caching keyed by adapter; loading and unloading while requests run; adapters waiting for a
slot or a disk load without holding up other requests."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runtime.errors import InvalidRequestError, UnknownAdapterError
from runtime.errors import UnknownLoraTaskError
from runtime.request import LoraTask
from tests.engine_harness import StepRecorder, collect, hf_greedy, load_hf, request, running_engine, wait_for
from tests.lora_adapters import make_peft_adapter, peft_greedy, trtllm_tensors
from tests.tiny_models import build_tiny_model

LLAMA_ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = [[5, 17, 33, 80, 120], [7, 7, 90, 200, 11, 64, 3, 150, 42], [250, 31], [12, 99, 99, 140, 6, 77, 18]]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    llama = build_tiny_model(root, "llama")
    gpt2 = build_tiny_model(root, "gpt2")
    return {
        "llama": llama,
        "gpt2": gpt2,
        # every projection, rank 4, alpha/r scaling
        "all": make_peft_adapter(llama, root / "all", LLAMA_ALL, r=4, alpha=8, seed=1),
        # attention only, rank 8, rsLoRA (alpha / sqrt(r))
        "attn_rs": make_peft_adapter(llama, root / "attn_rs", ["q_proj", "v_proj", "o_proj"], r=8, alpha=4,
                                     seed=2, use_rslora=True),
        # MLP only, per-module rank and alpha overrides
        "mlp_pat": make_peft_adapter(llama, root / "mlp_pat", ["gate_proj", "up_proj", "down_proj"], r=2, alpha=2,
                                     seed=3, rank_pattern={"down_proj": 6}, alpha_pattern={"up_proj": 5.0}),
        "gpt2_all": make_peft_adapter(gpt2, root / "gpt2_all", ["c_attn", "c_proj", "c_fc"], r=4, seed=4),
    }


def lora_request(rid: str, prompt: list[int], n: int, adapter: str | None = None, task: LoraTask | None = None):
    req = request(rid, prompt, n)
    req.adapter, req.lora_task = adapter, task
    return req


@pytest.mark.parametrize("arch,adapter", [("llama", "all"), ("llama", "attn_rs"), ("llama", "mlp_pat"),
                                          ("gpt2", "gpt2_all")])
async def test_greedy_with_adapter_alone_equals_peft(setup, arch: str, adapter: str) -> None:
    base, path = setup[arch], setup[adapter]
    async with running_engine(base, lora_modules={adapter: str(path)}) as engine:
        for i, prompt in enumerate(PROMPTS[:2]):
            want = peft_greedy(base, path, prompt, 12)
            assert want != hf_greedy(load_hf(base), prompt, 12)  # the adapter really changes the output
            out = await collect(engine, lora_request(f"r{i}", prompt, 12, adapter))
            assert out.tokens[0] == want


@pytest.mark.parametrize("all_slots", [True, False])
async def test_one_batch_mixing_three_adapters_and_the_base_equals_peft(setup, monkeypatch, all_slots) -> None:
    if not all_slots:  # the per-slot path of runtime/native/lora/apply.py (long prefills with high ranks)
        import runtime.native.lora.apply as apply

        monkeypatch.setattr(apply, "DENSE_COLUMNS", 0)
        monkeypatch.setattr(apply, "DENSE_TOKENS", 0)
    base = setup["llama"]
    names = ["all", "attn_rs", "mlp_pat"]
    jobs = [(name, prompt) for prompt in PROMPTS for name in [*names, None]]  # 16 requests
    async with running_engine(base, lora_modules={n: str(setup[n]) for n in names}, max_loras=4) as engine:
        rec = StepRecorder(engine)
        outs = await asyncio.gather(*(collect(engine, lora_request(f"r{i}", p, 10, name))
                                      for i, (name, p) in enumerate(jobs)))
        stats = engine.stats()
    for (name, prompt), out in zip(jobs, outs):
        want = hf_greedy(load_hf(base), prompt, 10) if name is None else peft_greedy(base, setup[name], prompt, 10)
        assert out.tokens[0] == want, (name, prompt)
    # the requests really shared forward passes: some step ran all 16 (4 adapters incl. the base)
    assert max(len({e.request_id for e in step}) for step in rec.steps) == 16
    assert stats.lora_requests == {"all": 4, "attn_rs": 4, "mlp_pat": 4}
    assert stats.lora_loaded == 3
    assert stats.lora_cache_misses == 3 and stats.lora_cache_hits == 9 and stats.lora_evictions == 0


async def test_more_adapters_than_slots_wait_their_turn_without_blocking_others(setup) -> None:
    """max_loras=1: requests of the second adapter wait until the first adapter's are done, while base
    requests run beside them; every output still equals the reference."""
    base = setup["llama"]
    names = ["all", "attn_rs"]
    async with running_engine(base, lora_modules={n: str(setup[n]) for n in names}, max_loras=1) as engine:
        rec = StepRecorder(engine)
        jobs = [("all", PROMPTS[0]), ("attn_rs", PROMPTS[1]), (None, PROMPTS[2]), ("all", PROMPTS[3])]
        outs = await asyncio.gather(*(collect(engine, lora_request(f"r{i}", p, 8, name))
                                      for i, (name, p) in enumerate(jobs)))
        stats = engine.stats()
    for (name, prompt), out in zip(jobs, outs):
        want = hf_greedy(load_hf(base), prompt, 8) if name is None else peft_greedy(base, setup[name], prompt, 8)
        assert out.tokens[0] == want
    first_steps = {e.request_id for e in rec.steps[0]}
    assert first_steps == {"r0", "r2", "r3"}  # base and the slot's adapter; r1 waits for the slot
    r1_first = min(i for i, _ in rec.of("r1"))
    assert r1_first > max(i for i, _ in rec.of("r0")) and r1_first > max(i for i, _ in rec.of("r3"))
    assert stats.lora_evictions == 1 and stats.lora_cache_misses == 2


async def test_triton_task_first_with_weights_then_by_id_alone(setup) -> None:
    base, path = setup["llama"], setup["all"]
    ids = {"q_proj": 1, "k_proj": 2, "v_proj": 3, "o_proj": 4, "gate_proj": 5, "down_proj": 6, "up_proj": 7}
    weights, config = trtllm_tensors(path, 8 / 4, ids)
    prompt = PROMPTS[1]
    want = peft_greedy(base, path, prompt, 10)
    async with running_engine(base, lora_modules={"registered": str(setup["attn_rs"])}) as engine:
        with pytest.raises(UnknownLoraTaskError, match="LoRA task 77 not found in cache"):
            await collect(engine, lora_request("u", prompt, 4, task=LoraTask(77)))
        first = await collect(engine, lora_request("a", prompt, 10, task=LoraTask(77, weights, config)))
        again = await collect(engine, lora_request("b", prompt, 10, task=LoraTask(77)))
        assert first.tokens[0] == want and again.tokens[0] == want
        # the id of an adapter registered by path (ids 1, 2, ... in registration order) names it
        by_id = await collect(engine, lora_request("c", prompt, 10, task=LoraTask(1)))
        assert by_id.tokens[0] == peft_greedy(base, setup["attn_rs"], prompt, 10)
        with pytest.raises(InvalidRequestError, match="lora_task_id 1 is the adapter 'registered'"):
            await collect(engine, lora_request("d", prompt, 4, task=LoraTask(1, weights, config)))
        with pytest.raises(InvalidRequestError, match="lora_config: module id 9 is not supported"):
            await collect(engine, lora_request("e", prompt, 4, task=LoraTask(5, [[0.0] * 8], [[9, 0, 1]])))
        with pytest.raises(InvalidRequestError, match="row 0 needs"):
            await collect(engine, lora_request("f", prompt, 4, task=LoraTask(5, [[0.0] * 8], [[1, 0, 2]])))
        assert engine.stats().lora_requests == {"lora_task_77": 2, "registered": 1}


async def test_triton_tasks_beyond_the_host_cache_evict_the_least_recently_used(setup) -> None:
    ids = {"q_proj": 1, "k_proj": 2, "v_proj": 3, "o_proj": 4, "gate_proj": 5, "down_proj": 6, "up_proj": 7}
    weights, config = trtllm_tensors(setup["all"], 2.0, ids)
    prompt = PROMPTS[2]
    async with running_engine(setup["llama"], max_cpu_loras=2, max_loras=1) as engine:
        for task in (10, 20):
            await collect(engine, lora_request(f"w{task}", prompt, 2, task=LoraTask(task, weights, config)))
        await collect(engine, lora_request("again10", prompt, 2, task=LoraTask(10)))  # 20 is now the oldest
        await collect(engine, lora_request("w30", prompt, 2, task=LoraTask(30, weights, config)))
        assert engine.lora.host.order() == ["lora_task_10", "lora_task_30"]
        with pytest.raises(UnknownLoraTaskError, match="LoRA task 20 not found"):
            await collect(engine, lora_request("gone", prompt, 2, task=LoraTask(20)))
        out = await collect(engine, lora_request("kept", prompt, 2, task=LoraTask(10)))
        stats = engine.stats()
    assert out.finish == {0: "length"}
    # one device slot: every switch between tasks evicted the slot's previous adapter
    assert (stats.lora_cache_misses, stats.lora_evictions, stats.lora_cache_hits) == (5, 4, 0)
    assert stats.lora_loaded == 2


async def test_triton_generate_body_reaches_the_adapter(setup) -> None:
    """The Triton dialect's inputs (adapters/triton) -> LoraTask -> the same tokens as PEFT."""
    from adapters.triton.generate import parse_generate

    base, path = setup["llama"], setup["all"]
    ids = {"q_proj": 1, "k_proj": 2, "v_proj": 3, "o_proj": 4, "gate_proj": 5, "down_proj": 6, "up_proj": 7}
    weights, config = trtllm_tensors(path, 8 / 4, ids)
    async with running_engine(base) as engine:
        prompt = engine.tokenizer.encode("the cat sat")

        def body(**lora):
            return {"input_ids": prompt, "input_lengths": len(prompt), "request_output_len": 6, **lora}

        def parse(b, rid):
            return parse_generate(b, model_name="tensorrt_llm", model_version="1", kind="ids",
                                  tokenizer=engine.tokenizer, request_id=rid).requests[0]

        first = parse(body(lora_task_id=3, lora_weights=[weights], lora_config=[config]), "t1")
        assert first.lora_task.task_id == 3
        out = await collect(engine, first)
        later = await collect(engine, parse(body(lora_task_id=3), "t2"))
        with pytest.raises(InvalidRequestError, match="lora_weights and lora_config need a lora_task_id"):
            parse(body(lora_weights=weights, lora_config=config), "t3")
        eos = set(engine.eos_token_ids)
    want = peft_greedy(base, path, prompt, 6)
    ends = [i for i, t in enumerate(want) if t in eos]
    want = want[: ends[0] + 1] if ends else want  # the engine stops at eos; the reference does not
    assert out.tokens[0] == want and later.tokens == out.tokens


async def test_prefix_cache_is_keyed_by_adapter(setup) -> None:
    base = setup["llama"]
    prompt = list(range(10, 30))  # 5 full blocks of 4
    async with running_engine(base, lora_modules={"all": str(setup["all"])}) as engine:
        base_out = await collect(engine, lora_request("b0", prompt, 4))
        lora_out = await collect(engine, lora_request("a0", prompt, 4, "all"))
        lora_again = await collect(engine, lora_request("a1", prompt, 4, "all"))
        base_again = await collect(engine, lora_request("b1", prompt, 4))
    assert base_out.usage.cached_tokens == 0
    assert lora_out.usage.cached_tokens == 0  # the base model's blocks are not the adapter's
    assert lora_again.usage.cached_tokens == 16 and base_again.usage.cached_tokens == 16
    assert lora_again.tokens == lora_out.tokens == {0: peft_greedy(base, setup["all"], prompt, 4)}


async def test_load_and_unload_while_requests_run(setup) -> None:
    base = setup["llama"]
    prompt = PROMPTS[0]
    async with running_engine(base, max_kv_tokens=256) as engine:
        with pytest.raises(UnknownAdapterError, match="'all' is not loaded"):
            await collect(engine, lora_request("x", prompt, 4, "all"))
        await engine.load_lora_adapter("all", str(setup["all"]))
        with pytest.raises(InvalidRequestError, match="already been loaded"):
            await engine.load_lora_adapter("all", str(setup["all"]))
        assert engine.lora_adapters() == {"all": str(setup["all"])}
        started = asyncio.Event()
        long = asyncio.create_task(collect(engine, lora_request("long", prompt, 60, "all"), started=started))
        await started.wait()
        await engine.unload_lora_adapter("all")  # the running request keeps its adapter to the end
        assert engine.lora_adapters() == {}
        with pytest.raises(UnknownAdapterError):
            await collect(engine, lora_request("y", prompt, 4, "all"))
        # a new adapter under the same name: new weights, no stale prefix blocks or slot
        await engine.load_lora_adapter("all", str(setup["attn_rs"]))
        other = await collect(engine, lora_request("z", prompt, 8, "all"))
        out = await long
        with pytest.raises(UnknownAdapterError, match="cannot be found"):
            await engine.unload_lora_adapter("nope")
        await wait_for(lambda: engine.lora.slots.pins == [0] * 8)
    assert out.tokens[0] == peft_greedy(base, setup["all"], prompt, 60)
    assert other.tokens[0] == peft_greedy(base, setup["attn_rs"], prompt, 8)
    assert other.usage.cached_tokens == 0


async def test_adapter_loading_from_disk_does_not_block_other_requests(setup, monkeypatch) -> None:
    """max_cpu_loras=1: the second adapter is read from disk on first use, on the loader thread; a base
    request submitted meanwhile finishes first."""
    import runtime.native.lora.manager as manager

    base = setup["llama"]
    gate = asyncio.Event()
    loop = asyncio.get_running_loop()
    real = manager.load_peft_adapter

    def slow_load(*args, **kwargs):
        asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(timeout=20)
        return real(*args, **kwargs)

    mods = {"all": str(setup["all"]), "attn_rs": str(setup["attn_rs"])}
    async with running_engine(base, lora_modules=mods, max_cpu_loras=1) as engine:
        monkeypatch.setattr(manager, "load_peft_adapter", slow_load)
        assert engine.lora.host.order() == ["all"]  # startup reads weights while the host cache has room
        waiting = asyncio.create_task(collect(engine, lora_request("w", PROMPTS[1], 6, "attn_rs")))
        base_out = await collect(engine, lora_request("b", PROMPTS[2], 6))
        assert not waiting.done() and engine.stats().waiting == 1
        gate.set()
        out = await waiting
        assert engine.lora.host.order() == ["attn_rs"]  # "all" (unused) was evicted for it
        assert engine.lora.host_evictions == 1
    assert base_out.tokens[0] == hf_greedy(load_hf(base), PROMPTS[2], 6)
    assert out.tokens[0] == peft_greedy(base, setup["attn_rs"], PROMPTS[1], 6)


async def test_adapter_that_fails_to_load_fails_its_requests_only(setup, tmp_path) -> None:
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(setup["all"], bad)
    mods = {"all": str(setup["all"]), "bad": str(bad)}
    async with running_engine(setup["llama"], lora_modules=mods, max_cpu_loras=1) as engine:
        (bad / "adapter_model.safetensors").write_bytes(b"not safetensors")
        out = await collect(engine, lora_request("x", PROMPTS[0], 4, "bad"))
        ok = await collect(engine, lora_request("y", PROMPTS[0], 4, "all"))
    assert out.finish == {0: "error"} and "cannot read the weights" in out.deltas[-1].error
    assert ok.finish == {0: "length"}


def test_rank_above_max_lora_rank_is_refused_at_start(setup) -> None:
    from runtime.config import EngineConfig
    from runtime.native.llm_engine import NativeEngine

    engine = NativeEngine(EngineConfig(model=str(setup["llama"]), device="cpu", max_kv_tokens=64,
                                       lora_modules={"big": str(setup["attn_rs"])}, max_lora_rank=4))
    with pytest.raises(InvalidRequestError, match=r"rank 8 exceeds --max-lora-rank \(4\)"):
        engine.load()
