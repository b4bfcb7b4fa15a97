"""RMSNorm kernels for CUDA (Triton): a row's norm, and the residual add joined to the norm after it. They follow
runtime/native/models/norm.py's roundings and conventions (HF Llama's cast before the weight; Gemma's (1 + weight) and
gpt-oss's weight in float32), so results match the eager module up to the order of the mean's float32 sums;
runtime/native/cuda/fused.py routes the modules through them, and its RoPE kernels normalise q/k heads with `scaled_norm`.
Where an FP8 projection reads the normed rows (`fp8`), the kernels write their E4M3 form too
(runtime/native/cuda/fp8_quant.py's rounding; one launch and one read of the rows fewer).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from runtime.native.cuda.fp8_quant import store_e4m3_row
from runtime.native.cuda.pdl import launch_options, wait_for_previous_kernel
from runtime.native.models.fp8 import FP8_MAX, MIN_SCALE


@triton.jit
def scaled_norm(normed, w_ptr, offs, mask, dtype, OFFSET: tl.constexpr, WEIGHT_F32: tl.constexpr):
    """The normalised float32 row times the norm's weight, as runtime/native/models/norm.py's RMSNorm rounds it: cast back
    before the weight (HF Llama), or (OFFSET + weight) in float32 then cast (Gemma, gpt-oss)."""
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if WEIGHT_F32:
        return (normed * (OFFSET + w)).to(dtype)
    return (w * normed.to(dtype).to(tl.float32)).to(dtype)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, q_ptr, scale_ptr, stride_x, stride_o, eps, N: tl.constexpr,
                     BLOCK: tl.constexpr, OFFSET: tl.constexpr, WEIGHT_F32: tl.constexpr, FP8: tl.constexpr,
                     FMAX: tl.constexpr, SMALLEST: tl.constexpr, PDL: tl.constexpr):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    y = scaled_norm(x * rstd, w_ptr, offs, mask, out_ptr.dtype.element_ty, OFFSET, WEIGHT_F32)
    tl.store(out_ptr + row * stride_o + offs, y, mask=mask)
    if FP8:
        store_e4m3_row(y, q_ptr, scale_ptr, row, offs, mask, N, FMAX, SMALLEST)


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, sum_ptr, out_ptr, q_ptr, scale_ptr, stride_x, stride_r, stride_s,
                         stride_o, eps, N: tl.constexpr, BLOCK: tl.constexpr, OFFSET: tl.constexpr,
                         WEIGHT_F32: tl.constexpr, FP8: tl.constexpr, FMAX: tl.constexpr, SMALLEST: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    dtype = sum_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
    total = (x + r).to(dtype)  # the residual stream, rounded as the eager add rounds it
    tl.store(sum_ptr + row * stride_s + offs, total, mask=mask)
    t = total.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(t * t, axis=0) / N + eps)
    y = scaled_norm(t * rstd, w_ptr, offs, mask, dtype, OFFSET, WEIGHT_F32)
    tl.store(out_ptr + row * stride_o + offs, y, mask=mask)
    if FP8:
        store_e4m3_row(y, q_ptr, scale_ptr, row, offs, mask, N, FMAX, SMALLEST)


def _fp8_options(fp8: tuple[torch.Tensor, torch.Tensor] | None, out: torch.Tensor) -> dict[str, Any]:
    """The norm kernels' E4M3 outputs and constexprs (without `fp8`, `out` in their place: never written)."""
    q, scale = fp8 if fp8 is not None else (out, out)
    return {"q_ptr": q, "scale_ptr": scale, "FP8": fp8 is not None, "FMAX": FP8_MAX, "SMALLEST": MIN_SCALE}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0,
             weight_in_float32: bool = False, fp8: tuple[torch.Tensor, torch.Tensor] | None = None,
             pdl: bool = False) -> torch.Tensor:
    """weight * (x / rms(x)) over the last dim, float32 inside; x [..., N] (offset, weight_in_float32: RMSNorm's).
    `fp8`: (E4M3 [T, N], float32 [T, 1]) that get each normed row quantized per token (fp8_quant.py's fp8_buffers).
    `pdl`: launched as a programmatic dependent (runtime/native/cuda/pdl.py; the GEMVs of a one-token step are)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    n = x2.shape[-1]
    if x2.shape[0]:
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(x2.shape[0],)](x2, weight, out, stride_x=x2.stride(0), stride_o=out.stride(0), eps=eps, N=n,
                                         BLOCK=block, OFFSET=offset, WEIGHT_F32=weight_in_float32 or offset != 0.0,
                                         **_fp8_options(fp8, out), num_warps=min(16, max(1, block // 256)),
                                         PDL=pdl, **launch_options(pdl))
    return out.view(x.shape)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0,
                 weight_in_float32: bool = False,
                 fp8: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, rms_norm(x + residual)) in one kernel; x and residual [T, N]; `fp8` as rms_norm's."""
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.shape[-1]
    if x.shape[0]:
        block = triton.next_power_of_2(n)
        _add_rms_norm_kernel[(x.shape[0],)](x, residual, weight, total, out, stride_x=x.stride(0),
                                            stride_r=residual.stride(0), stride_s=total.stride(0),
                                            stride_o=out.stride(0), eps=eps, N=n, BLOCK=block, OFFSET=offset,
                                            WEIGHT_F32=weight_in_float32 or offset != 0.0, **_fp8_options(fp8, out),
                                            num_warps=min(16, max(1, block // 256)))
    return total, out
