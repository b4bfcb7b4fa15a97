"""--kv-cache-dtype fp8: keys and values stored as FP8 E4M3 (per-tensor scale 1). The engine's greedy ids equal
transformers' greedy `generate` over a cache that rounds every key and value through E4M3 as it stores them (what
attention then reads); on CPU through the reference attention, on a GPU (ENGINE_TEST_DEVICE=cuda) through the Triton
kernels."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from runtime.model_spec import ModelSpec
from runtime.native.models import kv_cache_bytes_per_token
from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine
from tests.tiny_models import build_tiny_model

PROMPT = [5, 17, 42, 99, 7, 150, 3, 88, 19, 240, 61]


class Fp8RoundingCache(DynamicCache):
    """transformers' cache, each key and value rounded through E4M3 as it is stored."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,  # type: ignore[override]
               *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        def rounded(t: torch.Tensor) -> torch.Tensor:
            return t.to(torch.float8_e4m3fn).to(t.dtype)

        return super().update(rounded(key_states), rounded(value_states), layer_idx, *args, **kwargs)


def hf_greedy_fp8(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                             past_key_values=Fp8RoundingCache(config=model.config))
    return out[0, len(prompt):].tolist()


def test_an_fp8_cache_holds_twice_the_tokens_of_a_16_bit_one(tmp_path: Path) -> None:
    spec = ModelSpec.from_pretrained(str(build_tiny_model(tmp_path, "llama")))
    assert 2 * kv_cache_bytes_per_token(spec, torch.float8_e4m3fn) == kv_cache_bytes_per_token(spec, torch.bfloat16)


TWO_RANKS_HERE = not os.environ.get("ENGINE_TEST_DEVICE", "cpu").startswith("cuda") or torch.cuda.device_count() >= 2


@pytest.mark.parametrize(("arch", "ranks"), [
    ("llama", 1), ("qwen2", 1),
    pytest.param("llama", 2, marks=pytest.mark.skipif(not TWO_RANKS_HERE, reason="needs 2 GPUs"))])
async def test_greedy_ids_equal_transformers_over_an_fp8_rounding_cache(tmp_path: Path, arch: str, ranks: int) -> None:
    """Also split over two tensor-parallel ranks, each caching its KV heads in FP8."""
    checkpoint = build_tiny_model(tmp_path, arch)
    hf = load_hf(checkpoint)
    want = hf_greedy_fp8(hf, PROMPT, 16)
    assert want != hf_greedy(hf, PROMPT, 16)  # the rounding shows in the ids
    async with running_engine(checkpoint, kv_cache_dtype="fp8", max_num_tokens=8,
                              tensor_parallel_size=ranks) as engine:
        assert engine.runner.kv_caches[0].dtype == torch.float8_e4m3fn
        # a chunked prompt (8-token steps), then the same prompt again from the prefix cache, beside another request
        first = await collect(engine, request("a", PROMPT, 16))
        again, other = await asyncio.gather(collect(engine, request("b", PROMPT, 16)),
                                            collect(engine, request("c", PROMPT[:5], 16)))
    assert first.tokens[0] == want and again.tokens[0] == want
    assert other.tokens[0] == hf_greedy_fp8(hf, PROMPT[:5], 16)
