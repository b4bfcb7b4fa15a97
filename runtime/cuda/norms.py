"""RMSNorm kernels for CUDA (Triton): a row's norm, the residual add joined to the norm after it, and the per-head
q/k norms of Qwen3 and Gemma 3 in one launch. They follow runtime/models/norm.py's roundings and conventions (HF
Llama's cast before the weight; Gemma's (1 + weight) and gpt-oss's weight in float32), so results match the eager
module up to the order of the mean's float32 sums; runtime/cuda/fused.py routes the modules through them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import nn

from runtime.cuda import pdl
from runtime.cuda.pdl import wait_for_previous_kernel


@triton.jit
def _scaled(normed, w_ptr, offs, mask, dtype, OFFSET: tl.constexpr, WEIGHT_F32: tl.constexpr):
    """The normalised float32 row times the norm's weight, as runtime/models/norm.py's RMSNorm rounds it: cast back
    before the weight (HF Llama), or (OFFSET + weight) in float32 then cast (Gemma, gpt-oss)."""
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if WEIGHT_F32:
        return (normed * (OFFSET + w)).to(dtype)
    return (w * normed.to(dtype).to(tl.float32)).to(dtype)


@triton.jit
def _rms_norm_row(x_ptr, w_ptr, out_ptr, eps, N: tl.constexpr, BLOCK: tl.constexpr, OFFSET: tl.constexpr,
                  WEIGHT_F32: tl.constexpr):
    """out[:N] = RMSNorm(x[:N]) for one row (the kernels below: one row per program)."""
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(out_ptr + offs, _scaled(x * rstd, w_ptr, offs, mask, out_ptr.dtype.element_ty, OFFSET, WEIGHT_F32),
             mask=mask)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_o, eps, N: tl.constexpr, BLOCK: tl.constexpr,
                     OFFSET: tl.constexpr, WEIGHT_F32: tl.constexpr):
    row = tl.program_id(0)
    _rms_norm_row(x_ptr + row * stride_x, w_ptr, out_ptr + row * stride_o, eps, N, BLOCK, OFFSET, WEIGHT_F32)


@triton.jit
def _head_norms_kernel(q_ptr, k_ptr, q_norm_ptr, k_norm_ptr, out_ptr, stride_q, stride_k, q_eps, k_eps,
                       HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                       OFFSET: tl.constexpr, WEIGHT_F32: tl.constexpr, PDL: tl.constexpr):
    """Program (t, h): token t's head h of q (h < HQ, q_norm) or head h - HQ of k (k_norm), RMS-normalised into
    out [T, (HQ + HK) * D], each head as _rms_norm_kernel normalises a row (the same bits)."""
    wait_for_previous_kernel(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    out = out_ptr + (t * (HQ + HK) + h) * D
    if h < HQ:
        _rms_norm_row(q_ptr + t * stride_q + h * D, q_norm_ptr, out, q_eps, D, BLOCK, OFFSET, WEIGHT_F32)
    else:
        _rms_norm_row(k_ptr + t * stride_k + (h - HQ) * D, k_norm_ptr, out, k_eps, D, BLOCK, OFFSET, WEIGHT_F32)


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, sum_ptr, out_ptr, stride_x, stride_r, stride_s, stride_o, eps,
                         N: tl.constexpr, BLOCK: tl.constexpr, OFFSET: tl.constexpr, WEIGHT_F32: tl.constexpr):
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
    tl.store(out_ptr + row * stride_o + offs, _scaled(t * rstd, w_ptr, offs, mask, dtype, OFFSET, WEIGHT_F32),
             mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0,
             weight_in_float32: bool = False) -> torch.Tensor:
    """weight * (x / rms(x)) over the last dim, float32 inside; x [..., N] (offset, weight_in_float32: RMSNorm's)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    n = x2.shape[-1]
    if x2.shape[0]:
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(x2.shape[0],)](x2, weight, out, x2.stride(0), out.stride(0), eps, N=n, BLOCK=block,
                                         OFFSET=offset, WEIGHT_F32=weight_in_float32 or offset != 0.0,
                                         num_warps=min(16, max(1, block // 256)))
    return out.view(x.shape)


def head_norms(attn: nn.Module, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LlamaAttention.head_norms (Qwen3, Gemma 3: every head of q and k RMS-normalised) in one kernel: q [T, HQ*D]
    and k [T, HK*D] (rows may be strided views) -> views of one [T, (HQ + HK) * D] tensor."""
    q_norm, k_norm = attn.q_norm, attn.k_norm
    if q_norm is None or k_norm is None:
        return q, k
    head_dim, q_width = attn.attn.head_dim, q.shape[1]
    out = torch.empty((q.shape[0], q_width + k.shape[1]), dtype=q.dtype, device=q.device)
    if q.shape[0]:
        block = triton.next_power_of_2(head_dim)
        _head_norms_kernel[(q.shape[0], out.shape[1] // head_dim)](
            q, k, q_norm.weight, k_norm.weight, out, q.stride(0), k.stride(0), q_norm.eps, k_norm.eps,
            HQ=q_width // head_dim, HK=k.shape[1] // head_dim, D=head_dim, BLOCK=block, OFFSET=q_norm.offset,
            WEIGHT_F32=q_norm.weight_in_float32 or q_norm.offset != 0.0, PDL=pdl.ENABLED,
            num_warps=min(16, max(1, block // 256)), **pdl.launch_options())  # rms_norm's warps: its bits
    return out[:, :q_width], out[:, q_width:]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0,
                 weight_in_float32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, rms_norm(x + residual)) in one kernel; x and residual [T, N]."""
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.shape[-1]
    if x.shape[0]:
        block = triton.next_power_of_2(n)
        _add_rms_norm_kernel[(x.shape[0],)](x, residual, weight, total, out, x.stride(0), residual.stride(0),
                                            total.stride(0), out.stride(0), eps, N=n, BLOCK=block, OFFSET=offset,
                                            WEIGHT_F32=weight_in_float32 or offset != 0.0,
                                            num_warps=min(16, max(1, block // 256)))
    return total, out
