"""The families of issue 43 through the engine (NativeEngine, the public Engine interface): greedy ids equal
transformers' `generate` on tiny random checkpoints built by transformers' own config classes (tests/tiny_models.py),
alone and in a batch of requests joining at different steps with chunked prefill; sliding windows crossed by
prompts and by generation; MoE steps where every expert gets tokens and steps where some get none."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest
import torch

from runtime.native.models import moe
from runtime.model_spec import MoeSpec
from tests.engine_harness import StepRecorder, collect, hf_greedy, load_hf, request, running_engine
from tests.tiny_models import FAMILIES, SLIDING_WINDOW, build_tiny_model

pytestmark = pytest.mark.long_file  # (tests/conftest.py schedules it first)

MOE = ("mixtral", "qwen3_moe", "gpt_oss")
# Phi-3's LongRoPE picks its short factors for a served context within the original window (64 here), as
# transformers does for sequences that stay within it; `test_phi3_long_context_uses_the_long_factors` covers the rest
SERVE = {"phi3": {"max_model_len": 64}}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.nn.Module]]:
    root = tmp_path_factory.mktemp("families")
    return {arch: (path, load_hf(path)) for arch in FAMILIES for path in [build_tiny_model(root, arch)]}


def prompts(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 300) for _ in range(n)] for n in lengths]


@pytest.mark.parametrize("arch", FAMILIES)
async def test_greedy_alone_matches_transformers(models, arch: str) -> None:
    """A short prompt and one longer than the sliding window, each generating past the window."""
    path, hf = models[arch]
    async with running_engine(path, **SERVE.get(arch, {})) as engine:
        for i, prompt in enumerate(prompts([5, 2 * SLIDING_WINDOW + 3], seed=1)):
            out = await collect(engine, request(f"r{i}", prompt, 20))
            assert out.tokens[0] == hf_greedy(hf, prompt, 20), f"prompt {i}"


@pytest.mark.parametrize("arch", FAMILIES)
async def test_greedy_batch_joining_at_different_steps_matches_transformers(models, arch: str) -> None:
    """Six requests in three groups, each joining once the one before has tokens; max_num_tokens 8 prefills the
    longer prompts in chunks beside decodes (a chunk boundary inside and across the window)."""
    path, hf = models[arch]
    lengths, max_tokens = [3, 22, 9, 13, 5, 17], [24, 16, 20, 12, 18, 10]
    ps = prompts(lengths, seed=2)
    async with running_engine(path, max_num_tokens=8, **SERVE.get(arch, {})) as engine:
        rec = StepRecorder(engine)
        tasks: dict[int, asyncio.Task] = {}
        for group in ((0, 1), (2, 3), (4, 5)):
            events = []
            for i in group:
                events.append(asyncio.Event())
                tasks[i] = asyncio.create_task(collect(engine, request(f"r{i}", ps[i], max_tokens[i]),
                                                       started=events[-1], after_tokens=2))
            await asyncio.gather(*(ev.wait() for ev in events))
        outs = {i: await t for i, t in tasks.items()}
    for i in range(len(ps)):
        assert outs[i].tokens[0] == hf_greedy(hf, ps[i], max_tokens[i]), f"request {i}"
    assert any(any(e.is_prefill for e in step) and any(not e.is_prefill for e in step) for step in rec.steps)
    assert len([e for _, e in rec.of("r1") if e.is_prefill]) >= 3  # 22 tokens in chunks of at most 8


@pytest.mark.parametrize("arch", MOE)
async def test_moe_steps_with_every_expert_and_with_idle_experts(models, arch: str, monkeypatch) -> None:
    """A prefill of many tokens routes to every expert; a one-sequence decode step (top_k < experts) leaves some
    without tokens: both kinds of step happen, and the ids still equal transformers'."""
    path, hf = models[arch]
    tokens_per_expert: list[list[int]] = []
    route = moe.route

    def counting(logits: torch.Tensor, spec: MoeSpec) -> tuple[torch.Tensor, torch.Tensor]:
        weights, ids = route(logits, spec)
        tokens_per_expert.append(torch.bincount(ids.view(-1).cpu(), minlength=spec.num_experts).tolist())
        return weights, ids

    monkeypatch.setattr(moe, "route", counting)  # (the CPU's grouped products and CUDA's fused kernels alike)
    prompt = prompts([40], seed=3)[0]
    # op by op: a CUDA graph replays its steps without calling `counting` (and its capture may not copy to the host)
    async with running_engine(path, enable_cuda_graphs=False) as engine:
        out = await collect(engine, request("moe", prompt, 12))
    assert out.tokens[0] == hf_greedy(hf, prompt, 12)
    assert any(min(counts) > 0 for counts in tokens_per_expert), "no step gave every expert tokens"
    assert any(0 in counts for counts in tokens_per_expert), "no step left an expert idle"


async def test_phi3_long_context_uses_the_long_factors(models) -> None:
    """Served with a context past the original window, LongRoPE uses its long factors for every sequence (vLLM's
    choice); transformers does the same for a prompt already past the window, so the two agree there."""
    path, hf = models["phi3"]
    prompt = prompts([70], seed=4)[0]
    async with running_engine(path) as engine:  # max_model_len = max_position_embeddings (256) > 64
        out = await collect(engine, request("long", prompt, 10))
    assert out.tokens[0] == hf_greedy(hf, prompt, 10)


@pytest.mark.parametrize("arch", ["gpt_oss", "gemma3"])
async def test_cpu_kernels_and_compiled_decode_keep_the_ids(models, arch: str) -> None:
    """With --cpu-compile (the default outside tests): decode attention in the C++ kernel (window and sinks) and
    single-stream float32 decode steps compiled (gpt-oss's experts then run `Experts.gathered`)."""
    from runtime.native.cpu.compiled_decode import CompiledDecode

    if os.environ.get("ENGINE_TEST_DEVICE", "cpu") != "cpu":
        pytest.skip("the CPU's kernel and compiled steps")
    path, hf = models[arch]
    prompt = prompts([2 * SLIDING_WINDOW + 1], seed=5)[0]
    async with running_engine(path, cpu_compile=True) as engine:
        assert isinstance(engine.runner.graphs, CompiledDecode)
        out = await collect(engine, request("compiled", prompt, 16))
        together = await asyncio.gather(*(collect(engine, request(f"r{i}", p, 12))
                                          for i, p in enumerate(prompts([3, 11], seed=6))))
    assert out.tokens[0] == hf_greedy(hf, prompt, 16)
    for p, got in zip(prompts([3, 11], seed=6), together):
        assert got.tokens[0] == hf_greedy(hf, p, 12)


@pytest.mark.parametrize("arch", ["gemma3", "gpt_oss", "qwen3_moe"])
async def test_ngram_speculation_keeps_the_greedy_ids(models, arch: str) -> None:
    """N-gram drafts verified in multi-token rows (the prefill path, across sliding windows) change no id."""
    path, hf = models[arch]
    ps = [[11, 12, 13, 14] * 4 + [11, 12], [7, 8, 9] * 5 + [7]]  # repetitive: the n-gram proposer finds drafts
    async with running_engine(path, num_draft_tokens=3, speculative="ngram") as engine:
        outs = await asyncio.gather(*(collect(engine, request(f"s{i}", p, 20)) for i, p in enumerate(ps)))
        spec_steps = engine.stats().spec_steps
    assert spec_steps > 0
    for p, out in zip(ps, outs):
        assert out.tokens[0] == hf_greedy(hf, p, 20)


@pytest.mark.parametrize("arch", ["gemma3", "gpt_oss"])
async def test_prefix_cache_hits_past_the_window_keep_the_ids(models, arch: str) -> None:
    """A second request sharing a prefix longer than the window reads the first one's cached blocks."""
    path, hf = models[arch]
    shared = prompts([3 * SLIDING_WINDOW], seed=7)[0]
    ps = [shared + [5, 6, 7], shared + [90, 91]]
    async with running_engine(path) as engine:
        first = await collect(engine, request("a", ps[0], 12))
        second = await collect(engine, request("b", ps[1], 12))
    assert second.usage.cached_tokens >= 2 * SLIDING_WINDOW
    assert [first.tokens[0], second.tokens[0]] == [hf_greedy(hf, p, 12) for p in ps]


async def test_guided_decoding_on_a_moe_model(models) -> None:
    import re

    from runtime.request import GenerationRequest, GuidedDecoding, SamplingOptions

    path, _ = models["qwen3_moe"]
    guided = GenerationRequest("g", prompt_token_ids=[9, 9, 40], sampling=SamplingOptions(max_tokens=12, temperature=0),
                               guided=GuidedDecoding(regex=r"(yes|no)-[0-9]{2}"))
    async with running_engine(path) as engine:
        out = await collect(engine, guided)
    assert re.fullmatch(r"(yes|no)-[0-9]{2}", out.text[0]) and out.finish[0] == "stop"


async def test_blocks_behind_every_layers_window_are_given_back(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Phi-3 with a sliding window on every layer (as Phi-3-mini-4k's config has): a 60-token sequence in blocks of 4
    holds no more blocks than its window needs, and its ids still equal transformers'."""
    path = build_tiny_model(tmp_path_factory.mktemp("all-sliding"), "phi3", sliding_window=SLIDING_WINDOW)
    hf = load_hf(path)
    prompt = prompts([20], seed=8)[0]
    async with running_engine(path, max_model_len=64) as engine:
        assert engine.block_manager.window == SLIDING_WINDOW
        rec = StepRecorder(engine)
        out = await collect(engine, request("long", prompt, 40))
    assert out.tokens[0] == hf_greedy(hf, prompt, 40)
    assert max(rec.used_blocks) <= SLIDING_WINDOW // 4 + 3  # the window's blocks, the one being written, slack
    assert max(rec.used_blocks) < 60 // 4


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
async def test_lora_on_the_attention_projections_of_moe_models_equals_peft(models, arch: str,
                                                                         tmp_path: Path) -> None:
    """A PEFT adapter on q/k/v/o of a mixture-of-experts model gives transformers + PEFT's ids; a TensorRT-LLM module
    id of an MLP projection on an experts layer is refused in the caller's terms."""
    from runtime.errors import InvalidRequestError
    from runtime.native.lora.targets import LoraTargets
    from tests.lora_adapters import make_peft_adapter, peft_greedy

    path, hf = models[arch]
    adapter = make_peft_adapter(path, tmp_path / "attn", ["q_proj", "k_proj", "v_proj", "o_proj"], r=4, seed=9)
    prompt = prompts([9], seed=9)[0]
    want = peft_greedy(path, adapter, prompt, 12)
    assert want != hf_greedy(hf, prompt, 12)  # the adapter changes the output
    async with running_engine(path, lora_modules={"attn": str(adapter)}) as engine:
        req = request("lora", prompt, 12)
        req.adapter = "attn"
        out = await collect(engine, req)
        targets = LoraTargets(engine.runner.model)
    assert out.tokens[0] == want
    with pytest.raises(InvalidRequestError, match="module id 5 has no projection in layer 0"):
        targets.resolve_trtllm(5, 0)  # mlp_h_to_4h: layer 0 has experts
