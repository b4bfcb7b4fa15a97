"""--kv-cache-dtype fp8: keys and values stored as FP8 E4M3, per tensor with each layer's K and V scales from the
checkpoint (compressed-tensors, ModelOpt: tests/fp8_checkpoints.py writes them), else scale 1. The engine's greedy ids
equal transformers' greedy `generate` over a cache that rounds every key and value through the same scaled E4M3 as it
stores them (what attention then reads); on CPU through the reference attention, on a GPU (ENGINE_TEST_DEVICE=cuda)
through the Triton kernels."""

from __future__ import annotations

import asyncio
import logging
import math
import os
from pathlib import Path

import pytest
import torch

from runtime.model_spec import ModelSpec
from runtime.native.models import kv_cache_bytes_per_token, load_model
from tests.engine_harness import collect, hf_greedy, hf_greedy_fp8, load_hf, request, running_engine
from tests.fp8_checkpoints import amplify_kv, kv_scales_for, write_fp8_checkpoint
from tests.tiny_models import build_tiny_model

PROMPT = [5, 17, 42, 99, 7, 150, 3, 88, 19, 240, 61]


def test_an_fp8_cache_holds_twice_the_tokens_of_a_16_bit_one(tmp_path: Path) -> None:
    spec = ModelSpec.from_pretrained(str(build_tiny_model(tmp_path, "llama")))
    assert 2 * kv_cache_bytes_per_token(spec, torch.float8_e4m3fn) == kv_cache_bytes_per_token(spec, torch.bfloat16)


TWO_RANKS_HERE = not os.environ.get("ENGINE_TEST_DEVICE", "cpu").startswith("cuda") or torch.cuda.device_count() >= 2


@pytest.mark.parametrize(("arch", "ranks"), [
    ("llama", 1), ("qwen2", 1),
    pytest.param("llama", 2, marks=pytest.mark.skipif(not TWO_RANKS_HERE, reason="needs 2 GPUs"))])
async def test_greedy_ids_equal_transformers_over_an_fp8_rounding_cache(tmp_path: Path, arch: str, ranks: int,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Also split over two tensor-parallel ranks, each caching its KV heads in FP8. A checkpoint without KV scales:
    scale 1, and the log says so."""
    checkpoint = build_tiny_model(tmp_path, arch)
    hf = load_hf(checkpoint)
    want = hf_greedy_fp8(hf, PROMPT, 16)
    assert want != hf_greedy(hf, PROMPT, 16)  # the rounding shows in the ids
    with caplog.at_level(logging.INFO, logger="runtime.native.core_loader"):
        await _serves(checkpoint, hf, want, None, ranks)
    assert any(r.getMessage().startswith("FP8 KV cache: the checkpoint has no K/V scales; scale 1")
               for r in caplog.records)


SCALED_CHECKPOINTS = [  # (layout, legacy names, FP8 weights, tensor-parallel ranks)
    ("compressed-tensors", False, True, 1), ("compressed-tensors", True, True, 1), ("modelopt", False, True, 1),
    pytest.param("compressed-tensors", False, False, 2, marks=pytest.mark.skipif(not TWO_RANKS_HERE,
                                                                                reason="needs 2 GPUs"))]


@pytest.mark.parametrize(("layout", "legacy_names", "fp8_weights", "ranks"), SCALED_CHECKPOINTS,
                         ids=["compressed-tensors", "compressed-tensors-output-scale", "modelopt", "kv-only-2-ranks"])
async def test_a_checkpoints_kv_scales_are_what_the_fp8_cache_stores_and_reads_by(
        tmp_path: Path, layout: str, legacy_names: bool, fp8_weights: bool, ranks: int,
        caplog: pytest.LogCaptureFixture) -> None:
    """Keys and values past 448 (the model amplified: tests/fp8_checkpoints.py's amplify_kv) with each layer's scales
    in the checkpoint: greedy ids equal transformers' over a cache that rounds through the same scaled E4M3, which
    differ from scale 1's (saturating): they fail when the scales are not read. The scales of a checkpoint of 16-bit
    weights and KV scales only are the same on each tensor-parallel rank."""
    source = amplify_kv(build_tiny_model(tmp_path, "llama-untied"), tmp_path)
    scales = kv_scales_for(2)
    quantized, plain = write_fp8_checkpoint(source, tmp_path, layout, kv_scales=scales,  # type: ignore[arg-type]
                                            legacy_kv_names=legacy_names, weights=fp8_weights)
    hf = load_hf(plain)
    want = hf_greedy_fp8(hf, PROMPT, 16, scales)
    assert want != hf_greedy_fp8(hf, PROMPT, 16)  # scale 1 saturates these keys and values
    with caplog.at_level(logging.INFO, logger="runtime.native.core_loader"):
        await _serves(quantized, hf, want, scales, ranks)
    assert "FP8 KV cache: per-tensor scales from the checkpoint for 2 layers, K 3.25..3.75, V 3.5..3.75" in [
        r.getMessage() for r in caplog.records]


async def _serves(checkpoint: Path, hf: torch.nn.Module, want: list[int], scales: list[tuple[float, float]] | None,
                  ranks: int) -> None:
    """The engine over an FP8 cache gives `want` for PROMPT and the reference's ids for a shorter prompt beside it."""
    async with running_engine(checkpoint, kv_cache_dtype="fp8", max_num_tokens=8,
                              tensor_parallel_size=ranks) as engine:
        assert engine.runner.kv_caches[0].dtype == torch.float8_e4m3fn
        # a chunked prompt (8-token steps), then the same prompt again from the prefix cache, beside another request
        first = await collect(engine, request("a", PROMPT, 16))
        again, other = await asyncio.gather(collect(engine, request("b", PROMPT, 16)),
                                            collect(engine, request("c", PROMPT[:5], 16)))
    assert first.tokens[0] == want and again.tokens[0] == want
    assert other.tokens[0] == hf_greedy_fp8(hf, PROMPT[:5], 16, scales)


@pytest.mark.parametrize(("value", "message"), [
    (0.0, "is 0.0: a scale must be finite and above 0"), (-2.0, "is -2.0: a scale must be finite and above 0"),
    (math.nan, "is nan: a scale must be finite and above 0"), ([1.0, 2.0], "has 2 values: only per-tensor")])
def test_a_kv_scale_that_is_not_one_finite_value_above_0_is_a_load_error(tmp_path: Path, value: object,
                                                                         message: str) -> None:
    from safetensors.torch import load_file, save_file

    quantized, _ = write_fp8_checkpoint(build_tiny_model(tmp_path, "llama"), tmp_path, "compressed-tensors",
                                        kv_scales=kv_scales_for(2))
    tensors = load_file(str(quantized / "model.safetensors"))
    tensors["model.layers.1.self_attn.v_scale"] = torch.tensor(value if isinstance(value, list) else [value])
    save_file(tensors, str(quantized / "model.safetensors"))
    with pytest.raises(ValueError, match=f"KV-cache scale model.layers.1.self_attn.v_scale {message}"):
        load_model(str(quantized))
