"""The INT4 GEMV and GEMM (runtime/native/cuda/int4.py) vs the float32 reference dequantization of the same stored AWQ
weights (runtime/native/models/int4_checkpoint.py): on a GPU (ENGINE_TEST_DEVICE=cuda runs them there as the other
CUDA tests) or, without one, in Triton's interpreter (tests/triton_interpreter.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
from runtime.native.models import int4_checkpoint, load_model
from runtime.native.models.int4_checkpoint import (
    dequantize_awq,
    kernel_layout,
    quantize_rtn,
    unpack_awq,
)
from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine
from tests.int4_checkpoints import AWQ_PACK_ORDER, pack, write_int4_checkpoint
from tests.lora_adapters import make_peft_adapter, peft_greedy
from tests.tiny_models import build_tiny_model
from tests.triton_interpreter import RUN_HERE, kernels, run_in_interpreter

if RUN_HERE:
    from runtime.native.cuda.int4 import int4_linear

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_kernels_in_triton_interpreter() -> None:
    run_in_interpreter(__file__, passed=8)


def _awq_weight(n: int, k: int, group: int, seed: int,
                scale_dtype: torch.dtype = torch.float32) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """An AWQ-stored weight [n, k] as the kernels' tensors (from the stored ones, unpacked) and its reference
    dequantization (float32 [n, k]); the scales are rounded to scale_dtype first, as a checkpoint stores them."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g)
    q, zeros, scales = quantize_rtn(weight, torch.arange(k) // group, k // group, symmetric=False)
    scales = scales.to(scale_dtype).float()
    qweight, qzeros = pack(q, 1, AWQ_PACK_ORDER), pack(zeros, 1, AWQ_PACK_ORDER)
    reference = dequantize_awq(qweight, qzeros, scales)
    stored = kernel_layout(*unpack_awq(qweight, qzeros), scales, torch.float32)
    return tuple(t.to(DEVICE) for t in stored), reference.to(DEVICE)


@kernels
@pytest.mark.parametrize("rows", [1, 5, 33])  # the GEMV; the GEMM within one tile and past it
def test_the_int4_product_equals_the_reference_dequantized_product(rows: int) -> None:
    packed, reference = _awq_weight(104, 256, group=128, seed=rows)  # N past a tile's edge, two groups
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    # its own generator: the global one's draws depend on the tests run before (1 in 20 failed atol 1e-5 at 33 rows)
    bias = torch.randn(104, generator=torch.Generator().manual_seed(11)).to(DEVICE)
    got, want = int4_linear(x, *packed, bias), F.linear(x, reference, bias)
    # float32 sums in another order: up to 2.3e-5 apart (outputs up to 53) over 2000 biases
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    assert not torch.allclose(int4_linear(x, *packed), F.linear(x, reference.roll(1, 1)), atol=1e-2)


@kernels
@pytest.mark.parametrize("rows", [1, pytest.param(20, marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="Triton's interpreter gets tl.dot of bfloat16 wrong"))])
def test_the_int4_product_in_bfloat16_is_within_its_rounding(rows: int) -> None:
    packed, reference = _awq_weight(64, 128, group=32, seed=9, scale_dtype=torch.bfloat16)
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(8)).to(DEVICE, torch.bfloat16)
    qweight, zeros, scales = packed
    got = int4_linear(x, qweight, zeros, scales.bfloat16())
    torch.testing.assert_close(got.float(), F.linear(x.float(), reference), rtol=2e-2, atol=5e-2)


@kernels
@pytest.mark.parametrize(("layout", "arch", "kept_linears"), [
    ("awq", "llama-untied", 2 * 4), ("gptq", "llama-untied", 2 * 4), ("gptq", "qwen3_moe", 2 * 2 + 2)])  # + its one dense MLP
async def test_a_model_kept_in_int4_serves_its_dequantized_models_greedy_ids(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, arch: str, kept_linears: int) -> None:
    """The projections kept packed (as on CUDA; here forced, the kernels in the interpreter) go through Linear's INT4
    path: prefill through the GEMM, each decode step through the GEMV (an MoE's experts are dequantized)."""
    monkeypatch.setattr(int4_checkpoint, "keeps_int4", lambda device: True)
    quantized, plain = write_int4_checkpoint(build_tiny_model(tmp_path, arch), tmp_path, layout)  # type: ignore[arg-type]
    model = load_model(str(quantized), device=DEVICE, int4_kernels=True)
    kept = [name for name, _ in model.named_parameters() if name.endswith(".qweight")]
    assert len(kept) == kept_linears and model.get_submodule("model.layers.0.self_attn.qkv_proj").weight is None
    prompt = [5, 17, 42, 99, 7, 150, 3]
    async with running_engine(quantized, int4_kernels=True) as engine:
        out = await collect(engine, request(layout, prompt, 8))
    assert out.tokens[0] == hf_greedy(load_hf(plain), prompt, 8)


@kernels
async def test_a_lora_adapter_adds_its_updates_to_the_int4_product(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An adapter on every projection of a model kept in INT4 gives PEFT's greedy ids over the dequantized model."""
    monkeypatch.setattr(int4_checkpoint, "keeps_int4", lambda device: True)
    quantized, plain = write_int4_checkpoint(build_tiny_model(tmp_path, "llama"), tmp_path, "awq")
    adapter = make_peft_adapter(plain, tmp_path / "adapter", LORA_TARGETS, r=4, alpha=8, seed=1)
    prompt = [7, 7, 90, 200, 11, 64, 3]
    want = peft_greedy(plain, adapter, prompt, 8)
    assert want != hf_greedy(load_hf(plain), prompt, 8)  # the adapter changes the output
    async with running_engine(quantized, lora_modules={"a": str(adapter)}, int4_kernels=True) as engine:
        req = request("lora", prompt, 8)
        req.adapter = "a"
        out = await collect(engine, req)
    assert out.tokens[0] == want
