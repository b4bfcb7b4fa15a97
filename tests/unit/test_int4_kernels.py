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
    dequantize,
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
    from runtime.native.cuda import arrivals
    from runtime.native.cuda.int4 import int4_linear, tile_major
    from runtime.native.cuda.int4_gemv import int4_gemv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_kernels_in_triton_interpreter() -> None:
    run_in_interpreter(__file__, passed=12)


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
    return _kernel_tensors(*unpack_awq(qweight, qzeros), scales, torch.float32), reference.to(DEVICE)


def _kernel_tensors(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> tuple:
    """Unpacked values (q [in, out], zero points and scales [groups, out]) as the kernels' tile-major tensors on
    DEVICE, and N: the arguments after x of int4_linear and int4_gemv."""
    stored = tile_major(*kernel_layout(q, zeros, scales, dtype))
    return (*(t.to(DEVICE) for t in stored), q.shape[1])


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
    qweight, zeros, scales, n = packed
    got = int4_linear(x, qweight, zeros, scales.bfloat16(), n)
    torch.testing.assert_close(got.float(), F.linear(x.float(), reference), rtol=2e-2, atol=5e-2)


def _edge_weight(n: int, k: int, group: int, dtype: torch.dtype) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Random INT4 values with the extremes in place: rows whose zero points are 0 or 15 and rows of nibbles all 15
    (every packed word negative as an int32); the kernels' tensors and the float32 reference weight [n, k]."""
    g = torch.Generator().manual_seed(n + k + group)
    q = torch.randint(0, 16, (k, n), generator=g)
    zeros = torch.randint(0, 16, (k // group, n), generator=g)
    zeros[:, 0], zeros[:, 1], q[:, 2], zeros[:, 2], q[:, 3] = 0, 15, 15, 0, 0
    scales = (torch.rand(k // group, n, generator=g) * 0.1 + 0.01).to(dtype).float()
    reference = dequantize(q, zeros, scales, torch.arange(k) // group)
    return _kernel_tensors(q, zeros, scales, dtype), reference.to(DEVICE)


@kernels
@pytest.mark.parametrize(("k", "group", "tile"), [
    # steps of 16 words (one group), K in two parts of 32 and 16 words, loads two steps ahead (past a part's end)
    (384, 128, (32, 32, 4, 2, 2, 0)),
    (96, 32, (16, 16, 2, 1, 0, 0))])  # steps of 4 words, parts as many as fill the GPU
def test_the_int4_gemv_equals_the_reference_dequantized_product(k: int, group: int, tile: tuple[int, ...]) -> None:
    packed, reference = _edge_weight(72, k, group, torch.float32)  # N past a tile's edge
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    got = int4_gemv(x, *packed, tile=tile)
    torch.testing.assert_close(got, F.linear(x, reference), rtol=1e-5, atol=1e-4)
    assert torch.equal(int4_gemv(x, *packed, tile=tile), got)  # split-K adds its parts in order
    assert not arrivals.counters(x.device, 8).any()  # every launch leaves its counters at zero


@kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_int4_gemv_in_16_bits_is_within_its_rounding(dtype: torch.dtype) -> None:
    packed, reference = _edge_weight(64, 512, 128, dtype)
    x = torch.randn(1, 512, generator=torch.Generator().manual_seed(4)).to(DEVICE, dtype)
    got = int4_gemv(x, *packed, tile=(32, 16, 4, 2, 2, 0))
    want = F.linear(x.float(), reference)
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inline PTX: the interpreter takes the float32 path")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tile", [(32, 16, 4, 2, 2, 1), (32, 16, 4, 2, 2, 2), (64, 16, 4, 1, 0, 2),
                                  (16, 4, 2, 1, 0, 2), (256, 16, 8, 1, 0, 2)])
def test_the_int4_gemv_in_pairs_is_within_its_rounding(dtype: torch.dtype, tile: tuple[int, ...]) -> None:
    """Two weights an instruction (PAIRS 1 and 2) on the extremes (zero points 0 and 15, words of nibbles all 15:
    negative int32), in two parts of K loaded two steps ahead, the automatic split, steps of 4 words (groups of 32),
    and a tile of more rows than the weight."""
    group = 32 if tile[1] == 4 else 128
    packed, reference = _edge_weight(72, 512, group, dtype)  # N past a tile's edge
    x = torch.randn(1, 512, generator=torch.Generator().manual_seed(5)).to(DEVICE, dtype)
    got = int4_gemv(x, *packed, tile=tile).float()
    want = F.linear(x.float(), reference)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2 * want.abs().max().item())
    assert not torch.allclose(got, F.linear(x.float(), reference.roll(1, 1)), atol=1e-1)  # every column in place
    assert torch.equal(int4_gemv(x, *packed, tile=tile).float(), got)  # split-K adds its parts in order


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inline PTX: the interpreter takes the float32 path")
def test_the_int4_gemv_in_pairs_takes_x_at_an_odd_address() -> None:
    """x one bf16 past a 4-byte boundary (a column view) cannot be read as pairs of x: the float32 path, same sums."""
    packed, _ = _edge_weight(64, 256, 128, torch.bfloat16)
    padded = torch.randn(1, 257, generator=torch.Generator().manual_seed(6)).to(DEVICE, torch.bfloat16)
    x = padded[:, 1:]
    assert x.is_contiguous() and x.data_ptr() % 4 == 2
    got = int4_gemv(x, *packed, tile=(64, 16, 4, 1, 0, 2))
    torch.testing.assert_close(got, int4_gemv(x, *packed, tile=(64, 16, 4, 1, 0, 0)), rtol=0, atol=0)


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
