"""SwiGLU on CUDA (Triton): silu(gate) * up of a fused gate/up output, one kernel where eager runs two, rounded where
the eager ops round (runtime/native/models/llama.py's LlamaMLP). In a multi-row step of an FP8 model it also writes each
row's E4M3 form and scale for the down projection, as runtime/native/cuda/fp8_quant.py's _quantize_kernel does
(runtime/native/cuda/fused.py hands them on as Fp8Rows).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.native.cuda.fp8_quant import e4m3_scale, to_e4m3
from runtime.native.models.fp8 import FP8_MAX, MIN_SCALE


@triton.jit
def _silu_mul(x_row, offs, mask, I: tl.constexpr, dtype):
    """silu(gate) * up at lanes `offs` of a row of x [T, 2I], rounded to `dtype` where the eager ops round."""
    gate = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + I + offs, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (act * up).to(dtype)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, stride_x, I: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    tl.store(out_ptr + row * I + offs, _silu_mul(x_ptr + row * stride_x, offs, mask, I, out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _silu_mul_fp8_kernel(x_ptr, out_ptr, q_ptr, scale_ptr, stride_x, I: tl.constexpr, BLOCK: tl.constexpr,
                         FMAX: tl.constexpr, SMALLEST: tl.constexpr):
    """_silu_mul_kernel for a whole row per program, which then quantizes the row it wrote as
    runtime/native/cuda/fp8_quant.py's _quantize_kernel does (its largest magnitude needs every block first)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    out_row = out_ptr + row * I
    peak = tl.zeros([BLOCK], tl.float32)
    for start in range(0, I, BLOCK):
        mask = start + offs < I
        h = _silu_mul(x_ptr + row * stride_x, start + offs, mask, I, out_ptr.dtype.element_ty)
        tl.store(out_row + start + offs, h, mask=mask)
        peak = tl.maximum(peak, tl.abs(h.to(tl.float32)))
    scale = e4m3_scale(peak, FMAX, SMALLEST)
    tl.debug_barrier()  # the row's stores are seen by the loads below
    for start in range(0, I, BLOCK):
        mask = start + offs < I
        v = tl.load(out_row + start + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(q_ptr + row * I + start + offs, to_e4m3(v, scale, FMAX, q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def silu_and_mul(x: torch.Tensor, fp8: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """silu(x[:, :I]) * x[:, I:] for x [T, 2I]; `fp8`: (E4M3 [T, I], float32 [T, 1]) that get each row quantized per
    token too (fp8_quant.py's fp8_buffers)."""
    tokens, width = x.shape
    inter = width // 2
    out = torch.empty((tokens, inter), dtype=x.dtype, device=x.device)
    if tokens and fp8 is None:
        _silu_mul_kernel[(tokens, triton.cdiv(inter, 1024))](x, out, x.stride(0), I=inter, BLOCK=1024)
    elif tokens:  # a program a row: wide blocks, for more of the row's loads in flight at once
        block = min(4096, triton.next_power_of_2(inter))
        _silu_mul_fp8_kernel[(tokens,)](x, out, *fp8, x.stride(0), I=inter, BLOCK=block, FMAX=FP8_MAX,
                                        SMALLEST=MIN_SCALE, num_warps=8)
    return out
