"""FP8 products (runtime/native/models/fp8.py, the FP8 weights of runtime/native/cuda/gemv.py) vs a float reference dequantization of
the same stored E4M3 weights and scales.

The GEMV runs on a GPU or, without one, in Triton's interpreter (tests/triton_interpreter.py: it reads float8_e4m3fn
tensors); the tensor-core product (`torch._scaled_mm` over activations rounded to E4M3) needs a GPU of compute
capability 8.9 or later, and is skipped elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
from tests.triton_interpreter import RUN_HERE, kernels, run_in_interpreter  # noqa: E402

from runtime.native.models.fp8 import (  # noqa: E402
    FP8, dequantize, fp8_linear, fp8_reference, native_fp8, quantize_activations, quantize_rows)
from runtime.native.models.norm import RMSNorm  # noqa: E402

if RUN_HERE:
    from runtime.native.cuda.gemv import gemv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
tensor_cores = pytest.mark.skipif(not (torch.cuda.is_available() and native_fp8("cuda")),
                                  reason="FP8 tensor cores: CUDA compute capability 8.9+")


def test_kernels_in_triton_interpreter() -> None:
    run_in_interpreter(__file__, passed=15)


def _weights(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q, scale = quantize_rows(torch.randn(rows, cols, generator=g) * torch.rand(rows, 1, generator=g))
    return q.to(DEVICE), scale.to(DEVICE)


def _close(got: torch.Tensor, want: torch.Tensor, step: float) -> bool:
    """Within `step` of each value (relative, plus `step` of the mean magnitude for values near zero)."""
    mean = want.float().abs().mean().item()
    return bool(((got.float() - want.float()).abs() <= step * (want.float().abs() + mean)).all())


@kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fp8_gemv_equals_the_dequantized_weight_with_each_fused_prologue_and_epilogue(dtype: torch.dtype) -> None:
    """The GEMV multiplies the E4M3 weights, widened, by the activations as they are, and scales each row's float32
    sum: F.linear over the dequantized float32 weight, up to the order of the sums (and bf16 roundings)."""
    step = 1e-5 if dtype == torch.float32 else 2**-7
    g = torch.Generator().manual_seed(3)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(DEVICE, dtype)  # noqa: E731
    weight, scale = _weights(300, 1100, seed=4)  # rows and columns past a tile's edge
    x, bias, residual = rand(1, 1100), rand(300), rand(1, 300)
    w = dequantize(weight, scale, torch.float32)
    linear = lambda v, b=None: F.linear(v.float(), w, b).to(dtype)  # noqa: E731
    assert _close(gemv(x, weight, scale=scale), linear(x), step)
    assert _close(gemv(x, weight, bias, scale=scale), linear(x, bias.float()), step)
    norm = RMSNorm(1100, 1e-5, dtype=dtype).to(DEVICE)
    norm.weight.data = rand(1100)
    assert _close(gemv(x, weight, norm=(norm.weight, norm.eps), scale=scale), linear(norm(x)), step)
    assert _close(gemv(x, weight, residual=residual, scale=scale), residual + linear(x), step)
    gate, up = linear(norm(x)).split(150, dim=-1)  # the weight as a fused gate/up: 150 pairs
    glu = gemv(x, weight, norm=(norm.weight, norm.eps), glu=True, scale=scale)
    assert _close(glu, F.silu(gate) * up, step)
    logits = torch.empty(1, 300, dtype=torch.float32, device=DEVICE)  # float32 out: rounded to dtype first
    assert _close(gemv(x, weight, scale=scale, out=logits), linear(x), step)


@kernels
def test_a_one_row_fp8_linear_is_the_gemv_over_unrounded_activations() -> None:
    weight, scale = _weights(64, 96, seed=5)
    x = torch.randn(1, 96, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    want = F.linear(x, dequantize(weight, scale, torch.float32))
    assert _close(fp8_linear(x, weight, scale, None, None), want, 1e-5)


def test_the_reference_rounds_each_tokens_activations_to_e4m3_by_its_own_scale() -> None:
    """fp8_reference, what the tensor-core path computes: token t's activations as E4M3 times max|x_t| / 448."""
    weight, scale = _weights(32, 64, seed=7)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(8)) * torch.tensor([[0.01], [1.0], [100.0]])
    x = x.to(DEVICE)
    x_scale = x.abs().amax(dim=1, keepdim=True) / 448
    rounded = (x / x_scale).to(FP8).float() * x_scale
    assert torch.allclose(fp8_reference(x, weight, scale), F.linear(rounded, dequantize(weight, scale, torch.float32)),
                          rtol=1e-5, atol=1e-6)
    static = torch.tensor([0.5], device=DEVICE)  # a checkpoint's input_scale: values past 448 * 0.5 clip
    clipped = (x / 0.5).clamp(-448, 448).to(FP8).float() * 0.5
    assert torch.allclose(fp8_reference(x, weight, scale, static),
                          F.linear(clipped, dequantize(weight, scale, torch.float32)), rtol=1e-5, atol=1e-4)


@kernels
@pytest.mark.parametrize("static", [False, True])
def test_the_activation_kernel_rounds_as_the_torch_ops(static: bool) -> None:
    """runtime/native/cuda/fp8_quant.py: each token's scale as quantize_activations computes it (bit for bit), its values
    the same E4M3 (within one E4M3 step where a value sits at a rounding tie: the GPU's division is not IEEE's).
    In Triton's interpreter, rounding as the GPU does (tests/triton_interpreter.py)."""
    from runtime.native.cuda.fp8_quant import quantize_activations_cuda

    x = torch.randn(6, 3000, generator=torch.Generator().manual_seed(14)) * torch.tensor([[0.01], [1], [100], [0], [3],
                                                                                           [7]])
    x = x.to(DEVICE, torch.bfloat16)[:, 100:2900]  # strided rows, a K past the block
    input_scale = torch.tensor([2.0 / 448], device=DEVICE) if static else None
    q, scale = quantize_activations_cuda(x, input_scale)
    want_q, want_scale = quantize_activations(x, input_scale)
    assert torch.equal(scale, want_scale)
    got, want = q.float(), want_q.float()
    assert bool(((got - want).abs() <= want.abs() / 8).all())
    assert (got != want).float().mean().item() < 1e-3


def test_float32_rows_multiply_the_dequantized_weight_unrounded() -> None:
    """float32 serving (the engine tests' reference math): the stored weights times the activations as they are."""
    weight, scale = _weights(32, 64, seed=12)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(13)).to(DEVICE)
    assert torch.allclose(fp8_linear(x, weight, scale, None, None), F.linear(x, dequantize(weight, scale,
                                                                                         torch.float32)))


@tensor_cores
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("static", [False, True])
def test_the_tensor_core_product_equals_the_reference(dtype: torch.dtype, static: bool) -> None:
    """`torch._scaled_mm` over E4M3 activations (per token, or the static scale) and weights, both scales applied:
    the reference's float32 math up to the order of the sums and the output's rounding."""
    weight, scale = _weights(512, 768, seed=9)
    x = torch.randn(37, 768, generator=torch.Generator().manual_seed(10)).to(DEVICE, dtype)
    bias = torch.randn(512, generator=torch.Generator().manual_seed(11)).to(DEVICE, dtype)
    input_scale = torch.tensor([4.0 / 448], device=DEVICE) if static else None
    got = fp8_linear(x, weight, scale, input_scale, bias)
    # the product of the activations as the CUDA kernel rounds them (its own test allows a few near-ties to round
    # the other way, which moves a small output by more than the product's error: 0.02 in float16 on the H200)
    from runtime.native.cuda.fp8_quant import quantize_activations_cuda

    xq, x_scale = quantize_activations_cuda(x, input_scale)
    want = ((xq.float() @ weight.float().t() * x_scale * scale.float()[None, :]).to(dtype).float()
            + bias.float()).to(dtype)
    assert got.dtype == dtype
    # Hopper's FP8 tensor cores with bf16 out: 0.0056 of the scale here on the H200 (float32 out: 0.0009)
    assert _close(got, want, 2**-6)


@kernels
def test_a_one_token_step_through_fused_fp8_projections_equals_the_dequantized_model(tmp_path, monkeypatch) -> None:
    """A tiny bf16 Llama quantized to FP8 (--quantization fp8; its FP8 form kept, as on an H100): the one-token step
    through the fused GEMVs (norms, SwiGLU and residual adds inside, each projection's row scales applied) gives the
    hidden state of the same model with its E4M3 weights dequantized to bf16 through the bf16 GEMVs."""
    from runtime.native.attention_metadata import AttentionMetadata
    from runtime.native.cuda import fused
    from runtime.native.models import fp8_checkpoint, load_model
    from tests.tiny_models import build_tiny_model

    path = str(build_tiny_model(tmp_path, "llama"))
    dequantized = load_model(path, torch.bfloat16, torch.device(DEVICE), quantization="fp8")
    monkeypatch.setattr(fp8_checkpoint, "native_fp8", lambda device: True)
    model = load_model(path, torch.bfloat16, torch.device(DEVICE), quantization="fp8")
    assert model.model.layers[0].mlp.down_proj.weight.dtype == FP8
    for each in (model, dequantized):
        fused.use_fused_kernels(each)
        assert fused.one_token_projections(each.model)
    g = torch.Generator().manual_seed(4)
    spec = model.spec
    caches = [torch.randn(2, 16, 4, spec.num_kv_heads, spec.head_dim, generator=g).to(DEVICE, torch.bfloat16)
              for _ in range(spec.num_layers)]
    ints = lambda values, dtype=torch.int32: torch.tensor(values, dtype=dtype, device=DEVICE)  # noqa: E731
    # one new token at position 11 over blocks [5, 2, 9] of 4 slots: its slot is 9 * 4 + 3
    meta = AttentionMetadata(ints([0, 1]), ints([11]), ints([12]), ints([[5, 2, 9]]), ints([39], torch.int64), 4, 1,
                             12, [1], [12])
    ids, positions = ints([7], torch.long), ints([11], torch.long)
    fast = model.model(ids, positions, [c.clone() for c in caches], meta)
    want = dequantized.model(ids, positions, [c.clone() for c in caches], meta)
    assert ((fast.float() - want.float()).norm() / want.float().norm()).item() < 2e-2


@kernels
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # silu of a large negative gate, in the interpreter
@pytest.mark.parametrize("width", [48, 1000, 5000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_norms_and_swiglu_quantize_the_rows_they_write_as_the_activation_kernel_does(dtype: torch.dtype,
                                                                                         width: int) -> None:
    """Where an FP8 projection reads their rows, runtime/native/cuda/norms.py's kernels and fused.py's SwiGLU also write
    each row's E4M3 values and scale: bit for bit what fp8_quant.py's kernel makes of the 16-bit rows they write
    (which are the rows they write without). Rows of ordinary, tiny, large (past 448) and zero values, and rows
    with some zeros; widths within a block, past a power of two, and past a block of the quantizing kernel (2048) and
    of the quantizing SwiGLU (4096)."""
    from runtime.native.cuda.fp8_quant import fp8_buffers, quantize_activations_cuda
    from runtime.native.cuda.swiglu import silu_and_mul
    from runtime.native.cuda.norms import add_rms_norm, rms_norm

    g = torch.Generator().manual_seed(15)
    magnitudes = torch.tensor([[1.0], [1e-3], [30.0], [0.0], [1.0]])

    def rows(width: int) -> torch.Tensor:
        x = torch.randn(5, width, generator=g) * magnitudes
        x[4, ::3] = 0
        return x.to(DEVICE, dtype)

    def check(write: Callable[[tuple[torch.Tensor, torch.Tensor] | None], torch.Tensor]) -> None:
        fp8 = fp8_buffers(5, width, torch.device(DEVICE))
        got = write(fp8)
        assert torch.equal(got, write(None))
        want_values, want_scales = quantize_activations_cuda(got, None)
        assert torch.equal(fp8[0].view(torch.uint8), want_values.view(torch.uint8))
        assert torch.equal(fp8[1], want_scales)

    x, residual, gate_up = rows(width), rows(width), rows(2 * width)
    weight = (torch.randn(width, generator=g) * 50).to(DEVICE, dtype)  # normed values past 448
    check(lambda fp8: rms_norm(x, weight, 1e-6, fp8=fp8))
    check(lambda fp8: rms_norm(x, weight, 1e-6, offset=1.0, fp8=fp8))  # Gemma's (1 + weight)
    check(lambda fp8: add_rms_norm(x, residual, weight, 1e-5, fp8=fp8)[1])
    check(lambda fp8: silu_and_mul(gate_up, fp8))


@kernels
# bfloat16 on a GPU only: Triton's interpreter multiplies bfloat16 tiles in tl.dot wrongly (test_cuda_families.py)
@pytest.mark.parametrize("dtype", [torch.float16] + [torch.bfloat16] * torch.cuda.is_available())
def test_a_multi_row_fp8_step_through_quantizing_norms_and_swiglu_equals_the_unfused_step(dtype: torch.dtype, tmp_path,
                                                                                          monkeypatch) -> None:
    """A tiny 16-bit Llama quantized to FP8 (--quantization fp8; its FP8 form kept, as on an H100): a prefill of two
    sequences and a two-row decode step whose norms and SwiGLU quantize the inputs of the q/k/v, gate/up and down
    projections give the logits, bit for bit, of the same steps where every projection quantizes its own input;
    only the o projections quantize their own."""
    from runtime.native.cuda import fp8_quant, fused
    from runtime.native.cuda.paged_attention import triton_paged_attention
    from runtime.native.models import attention, fp8_checkpoint, load_model
    from runtime.native.models import fp8 as fp8_module
    from tests.tiny_models import build_tiny_model
    from tests.unit.test_models import OTHER_PROMPT, PROMPT, PagedRunner

    path = str(build_tiny_model(tmp_path, "llama"))
    monkeypatch.setattr(fp8_checkpoint, "native_fp8", lambda device: True)
    model = load_model(path, dtype, torch.device(DEVICE), quantization="fp8")
    fused.use_fused_kernels(model)
    monkeypatch.setattr(fused, "MAX_TOKENS", 1)  # the two-row step as a step of more rows than GEMVs take
    layers = model.spec.num_layers
    assert all(layer.mlp.down_proj.takes_fp8_rows for layer in model.model.layers)
    quantized: list[int] = []  # the rows of each projection that quantized its own input
    module, name = ((fp8_quant, "quantize_activations_cuda") if DEVICE == "cuda"
                    else (fp8_module, "quantize_activations"))
    quantize = getattr(module, name)
    monkeypatch.setattr(module, name, lambda x, input_scale: quantized.append(x.shape[0]) or quantize(x, input_scale))

    def steps() -> torch.Tensor:
        attention.register_attention_backend(DEVICE, triton_paged_attention)
        try:
            runner = PagedRunner(model)
            out = runner.step([("a", PROMPT), ("b", OTHER_PROMPT)])
            out += runner.step([("a", [5]), ("b", [250])])
            return torch.cat(out)
        finally:
            attention.register_attention_backend(DEVICE, attention.torch_paged_attention)

    fast = steps()
    assert quantized == [len(PROMPT) + len(OTHER_PROMPT)] * layers + [2] * layers  # o_proj's
    quantized.clear()
    monkeypatch.setattr(fused, "_fp8_buffers_for", lambda linear, x: None)
    plain = steps()
    assert len(quantized) == 8 * layers
    assert bool(fast.isfinite().all()) and torch.equal(fast, plain)
