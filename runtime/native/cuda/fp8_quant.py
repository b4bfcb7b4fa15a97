"""Activations to E4M3 for the FP8 tensor-core product (runtime/native/models/fp8.py), one kernel per projection.

Why: the same rounding in torch ops (abs, amax, divide, clamp, cast) is five or six kernels a projection, four
projections a layer: some 700 launches more in each multi-row step of a 32-layer model. Here one program per token
finds its largest magnitude and writes the E4M3 values and the token's float32 scale (or uses the static scale).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.native.models.fp8 import FP8, FP8_MAX, MIN_SCALE


@triton.jit
def e4m3_scale(peak, FMAX: tl.constexpr, SMALLEST: tl.constexpr):
    """A token's float32 scale from its lanes' largest magnitudes `peak` (float32 [BLOCK], each lane's running
    tl.maximum from zero)."""
    return tl.maximum(tl.max(peak, axis=0) / FMAX, SMALLEST)


@triton.jit
def to_e4m3(v, scale, FMAX: tl.constexpr, dtype):
    """Activations `v` (float32, widened from their 16-bit values) as E4M3 `dtype` by the token's `scale`."""
    return tl.minimum(tl.maximum(v / scale, -FMAX), FMAX).to(dtype)


@triton.jit
def store_e4m3_row(y, q_ptr, scale_ptr, row, offs, mask, K: tl.constexpr, FMAX: tl.constexpr,
                   SMALLEST: tl.constexpr):
    """Token `row`'s 16-bit activations `y` (its whole row in registers, 0 past its K) as E4M3 at q_ptr [T, K] and
    its scale at scale_ptr [T, 1], as _quantize_kernel rounds them from memory."""
    v = y.to(tl.float32)
    scale = e4m3_scale(tl.maximum(tl.zeros_like(v), tl.abs(v)), FMAX, SMALLEST)
    tl.store(q_ptr + row * K + offs, to_e4m3(v, scale, FMAX, q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


@triton.jit
def _quantize_kernel(x_ptr, q_ptr, scale_ptr, static_ptr, stride_x, K: tl.constexpr, BLOCK_K: tl.constexpr,
                     FMAX: tl.constexpr, SMALLEST: tl.constexpr, STATIC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    x_row = x_ptr + row * stride_x
    if STATIC:
        scale = tl.load(static_ptr).to(tl.float32)
    else:
        peak = tl.zeros([BLOCK_K], tl.float32)
        for k in range(0, K, BLOCK_K):
            v = tl.load(x_row + k + offs, mask=k + offs < K, other=0.0).to(tl.float32)
            peak = tl.maximum(peak, tl.abs(v))
        scale = e4m3_scale(peak, FMAX, SMALLEST)
    for k in range(0, K, BLOCK_K):
        mask = k + offs < K
        v = tl.load(x_row + k + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(q_ptr + row * K + k + offs, to_e4m3(v, scale, FMAX, q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def fp8_buffers(tokens: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (E4M3 [T, K], float32 scales [T, 1]) for T tokens' activations quantized per token."""
    return (torch.empty((tokens, k), dtype=FP8, device=device),
            torch.empty((tokens, 1), dtype=torch.float32, device=device))


def quantize_activations_cuda(x: torch.Tensor, input_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """runtime/native/models/fp8.py's quantize_activations in one kernel: x [T, K] (rows may be strided) -> (E4M3 [T, K],
    float32 scales [T, 1])."""
    tokens, k = x.shape
    q, scale = fp8_buffers(tokens, k, x.device)
    if tokens:
        _quantize_kernel[(tokens,)](x, q, scale, input_scale if input_scale is not None else scale, x.stride(0), K=k,
                                    BLOCK_K=min(2048, triton.next_power_of_2(k)), FMAX=FP8_MAX, SMALLEST=MIN_SCALE,
                                    STATIC=input_scale is not None)
    return q, scale
