"""FP8 (E4M3) projection weights: quantizing, dequantizing, and the product of a Linear that holds them.

An FP8 Linear holds `weight` as float8_e4m3fn [out, in] and `weight_scale` float32 [out]: W ~= weight * scale[:, None]
(a per-tensor checkpoint scale is repeated over its rows, so fused q/k/v parts with scales of their own, and
per-channel scales, are one layout). `input_scale` (float32 [1]) is a checkpoint's static activation scale; without
it each token's activations get their own scale (dynamic, per token).

Products on CUDA with FP8 tensor cores (compute capability 8.9 and later; `native_fp8`):
- a step of several rows quantizes its 16-bit activations to E4M3 (per token, or by the static scale) and multiplies
  on the FP8 tensor cores (`torch._scaled_mm`, float32 sums, both scales applied to the output; on CUDA the norm or
  SwiGLU kernel before a projection quantizes its rows already where it can: Fp8Rows); float32 activations
  (the reference math the tests serve) multiply the dequantized weight as they are;
- a one-row step reads the FP8 weights in the GEMV kernel (runtime/native/cuda/gemv.py), which multiplies them by the 16-bit
  activations as they are (no activation rounding) and applies the row scales to the sums.
Everywhere else (CPU, older GPUs) FP8 weights are dequantized once at load to the served dtype
(runtime/native/models/fp8_checkpoint.py logs it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
# Hopper's FP8 products without the periodic promotion of partial sums to float32, as vLLM's CUTLASS FP8 GEMMs run
# (docs/quantization.md: +5.5% 8B throughput, +0.6% perplexity on the default model)
FAST_ACCUM = True
MIN_SCALE = 1e-12  # the smallest scale: an all-zero row or token quantizes to zeros, not NaNs


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    """A CUDA device's compute capability, asked once: every multi-row FP8 product (each projection of an eager
    step) needs it."""
    return torch.cuda.get_device_capability(device)


def native_fp8(device: torch.device | str) -> bool:
    """FP8 tensor cores (and `torch._scaled_mm`) on this device: CUDA compute capability 8.9 (Ada) or later."""
    device = torch.device(device)
    return device.type == "cuda" and _capability(device) >= (8, 9)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (per output channel) symmetric E4M3: (q [out, in] float8, scale [out] float32), the largest magnitude
    of each row mapped to 448."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=MIN_SCALE)
    return (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def dequantize(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """weight * scale in float32, then rounded once to `dtype`; scale: a scalar, [out] or [out, 1]."""
    scale = scale.float().reshape(-1)
    rows = scale if scale.numel() == 1 else scale[:, None]
    return (weight.float() * rows).to(dtype)


def quantize_activations(x: torch.Tensor, input_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (E4M3 [T, K], float32 scales [T, 1]): each token by its own largest magnitude, or all by the
    checkpoint's static `input_scale`."""
    if input_scale is None:
        scale = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=MIN_SCALE)
    else:
        scale = input_scale.float().reshape(1, 1).expand(x.shape[0], 1).contiguous()  # _scaled_mm's row scales
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


@dataclass(frozen=True)
class Fp8Rows:
    """16-bit activations with their per-token E4M3 form, written by the kernel that wrote the activations
    (runtime/native/cuda/fused.py's norms and SwiGLU), so that the FP8 product skips its own quantizing kernel."""

    rows: torch.Tensor  # [T, K] bfloat16 or float16
    values: torch.Tensor  # [T, K] float8_e4m3fn: rows / scales, as quantize_activations rounds them
    scales: torch.Tensor  # [T, 1] float32: each token's dynamic scale


def scaled_mm_fits(weight: torch.Tensor) -> bool:
    """`torch._scaled_mm` takes both of the product's dimensions in multiples of 16."""
    out, inputs = weight.shape
    return out % 16 == 0 and inputs % 16 == 0


def fp8_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                  input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The FP8 product in float32 arithmetic (activations rounded to E4M3 as the tensor-core path rounds them): what
    fp8_linear computes, up to the order of the sums. Also the path for shapes `_scaled_mm` does not take."""
    xq, x_scale = quantize_activations(x, input_scale)
    return ((xq.float() @ weight.float().t()) * x_scale * scale.float()[None, :]).to(x.dtype)


def fp8_linear(x: torch.Tensor | Fp8Rows, weight: torch.Tensor, scale: torch.Tensor,
               input_scale: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x W^T (+ bias) for W = weight * scale[:, None] in FP8, x [T, in] in 16 bits -> [T, out] in x's dtype.
    x as Fp8Rows: already quantized per token (for a weight without `input_scale` that `_scaled_mm` takes)."""
    if isinstance(x, Fp8Rows):
        y = _scaled_product(x.rows, x.values, x.scales, weight, scale)
        return y if bias is None else y + bias
    if x.shape[0] == 1 and x.stride(-1) == 1:
        from runtime.native.cuda.gemv import gemv  # Triton is needed on CUDA only

        return gemv(x, weight, bias, scale=scale)
    if x.dtype == torch.float32:  # float32 serving is the reference math: the stored weights, activations unrounded
        return F.linear(x, dequantize(weight, scale, torch.float32), bias)
    if not scaled_mm_fits(weight):
        y = fp8_reference(x, weight, scale, input_scale)
    else:
        if x.is_cuda:  # one kernel, not six
            from runtime.native.cuda.fp8_quant import quantize_activations_cuda

            xq, x_scale = quantize_activations_cuda(x if x.stride(-1) == 1 else x.contiguous(), input_scale)
        else:
            xq, x_scale = quantize_activations(x, input_scale)
        y = _scaled_product(x, xq, x_scale, weight, scale)
    return y if bias is None else y + bias


def _scaled_product(x: torch.Tensor, xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                    scale: torch.Tensor) -> torch.Tensor:
    """xq [T, in] E4M3 (the 16-bit x rounded, by the row scales x_scale [T, 1]) times the FP8 weight on the tensor
    cores, both scales applied -> [T, out] in x's dtype."""
    w_scale = scale.view(1, -1)
    if x.dtype == torch.bfloat16 and x.is_cuda and _capability(x.device) >= (9, 0):
        # per-row scales inside the product (Hopper's CUTLASS kernels); its output is bf16 only
        return torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=x.dtype,
                                use_fast_accum=FAST_ACCUM)
    # Ada, or float16 activations (or the CPU): float32 output, the scales applied after
    one = torch.ones((), dtype=torch.float32, device=x.device)
    y = torch._scaled_mm(xq, weight.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    return (y * x_scale * w_scale).to(x.dtype)
