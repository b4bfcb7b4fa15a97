"""The tokens a step holds when --max-num-tokens is not given: chosen per model on a GPU (runtime/native/step_tokens.py),
2048 on CPU, and the same value in the core and in the front end that validates against it."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.config import EngineConfig
from runtime import build_engine
from runtime.model_spec import ModelSpec
from runtime.native.step_tokens import default_max_num_tokens, weights_per_token
from tests.tiny_models import build_tiny_model

LLAMA = dict(architectures=["LlamaForCausalLM"], vocab_size=128256, num_attention_heads=32, num_key_value_heads=8,
             max_position_embeddings=131072)
SHAPES = {  # config.json's shape fields of the published models
    "Llama-3.2-1B": dict(LLAMA, hidden_size=2048, num_hidden_layers=16, intermediate_size=8192, head_dim=64),
    "Llama-3.1-8B": dict(LLAMA, hidden_size=4096, num_hidden_layers=32, intermediate_size=14336),
    "Qwen3-30B-A3B": dict(architectures=["Qwen3MoeForCausalLM"], vocab_size=151936, hidden_size=2048,
                          num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                          max_position_embeddings=40960),
    "SmolLM2-135M": dict(architectures=["LlamaForCausalLM"], vocab_size=49152, hidden_size=576, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                         max_position_embeddings=8192),
}


@pytest.mark.parametrize(("model", "weights", "tokens"), [
    ("Llama-3.2-1B", 973_078_528, 8192), ("Llama-3.1-8B", 6_979_321_856, 2048),
    ("Qwen3-30B-A3B", 2_717_908_992, 4096), ("SmolLM2-135M", 106_168_320, 8192)])
def test_a_gpu_step_holds_about_40_tflop_of_prompt_products(model: str, weights: int, tokens: int) -> None:
    """The decoder's weights a token multiplies (Llama-3.1-8B: 8.03B parameters less its two 525M embeddings; the
    MoE: 8 of 128 experts), and the largest power of 2 of tokens within 40 TFLOP, between 2048 and 8192."""
    spec = ModelSpec.from_config(SHAPES[model])
    assert weights_per_token(spec) == weights
    assert default_max_num_tokens(spec, "cuda") == tokens
    assert default_max_num_tokens(spec, "cpu") == 2048


@pytest.mark.parametrize(("model", "tokens"), [("Llama-3.2-1B", 8192), ("Llama-3.1-8B", 4096),
                                               ("Qwen3-30B-A3B", 8192)])
def test_fp8_products_count_half(model: str, tokens: int) -> None:
    """FP8 tensor cores multiply at twice bf16's rate: the same step time holds twice the tokens (within 8192)."""
    spec = ModelSpec.from_config(SHAPES[model])
    assert default_max_num_tokens(spec, "cuda", fp8_products=True) == tokens
    assert default_max_num_tokens(spec, "cpu", fp8_products=True) == 2048


@pytest.mark.parametrize(("quantization", "checkpoint_fp8", "tokens"), [
    ("none", False, 2048), ("fp8", False, 4096), ("none", True, 4096)])
def test_an_fp8_8b_model_on_fp8_tensor_cores_steps_4096_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              quantization: str, checkpoint_fp8: bool,
                                                              tokens: int) -> None:
    """describe_model counts FP8 products half for `--quantization fp8` and for an FP8 checkpoint, on a device with
    FP8 tensor cores (stood in for here: the folder holds the 8B's config and a tokenizer, no weights)."""
    import json

    import torch

    import runtime.native.core_loader as core_loader
    from benchmarks.gpu_families import SHAPES as GPU_SHAPES, write_config

    model_type, shape = GPU_SHAPES["llama-3.1-8b"]
    folder = write_config(tmp_path / "llama-8b", model_type, shape)
    if checkpoint_fp8:
        config = json.loads((folder / "config.json").read_text())
        config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
        (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(core_loader, "resolve_device", lambda device: torch.device("cuda"))
    monkeypatch.setattr(core_loader, "native_fp8", lambda device: True)
    model = core_loader.describe_model(EngineConfig(model=str(folder), quantization=quantization, dtype="bfloat16"))
    assert model.info.max_num_tokens == tokens


@pytest.mark.parametrize("engine_process", [False, True])
@pytest.mark.parametrize(("given", "used"), [(None, 2048), (24, 24)])
async def test_the_core_and_the_front_end_use_the_same_tokens_a_step(tmp_path: Path, engine_process: bool,
                                                                    given: int | None, used: int) -> None:
    """The core resolves the default; a front end in another process learns it at start (it refuses prompts longer
    than a step when chunked prefill is off) and reports it in the stats."""
    from runtime.errors import InvalidRequestError
    from tests.engine_harness import collect, request

    config = EngineConfig(model=str(build_tiny_model(tmp_path, "llama")), device="cpu", dtype="float32",
                          max_kv_tokens=1024, max_num_tokens=given, enable_chunked_prefill=False,
                          engine_process=engine_process)
    engine = build_engine(config)
    await engine.start()
    try:
        assert engine.model_info.max_num_tokens == used and engine.stats().max_num_tokens == used
        assert (await collect(engine, request("fits", [5] * 20, 2))).finish == {0: "length"}
        if used < 200:  # (the tiny model's window is 256 tokens)
            with pytest.raises(InvalidRequestError, match=f"more than max_num_tokens \\({used}\\)"):
                await collect(engine, request("long", [5] * (used + 1), 2))
    finally:
        await engine.shutdown()
