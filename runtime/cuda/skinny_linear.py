"""A Triton matmul for projections of a few rows (decode steps): y [M, N] = x [M, K] W^T [K, N] (+ b), M <= 16.

Why: at batch 1 the Llama-3.2-1B decode step is bound by reading the weights, and cuBLAS's choice for the
narrow projections (q/k/v 3,072 wide and o_proj 2,048 wide) runs 32-48 thread blocks on an H200's 132 SMs,
reading 1.4-2.1 TB/s of its 4.8 (benchmarks/skinny_gemm.py). Here each program owns BLOCK_N output columns
for all rows and streams their weight rows over K, so a 2,048-wide projection has 128 programs in flight.
Accumulation is float32 (the K order differs from cuBLAS's: results agree to bf16 rounding, not bitwise).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 16  # one tensor-core tile of rows; bigger steps use cuBLAS


@triton.jit
def _skinny_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, K, BLOCK_K):
        ks = k + offs_k
        if EVEN_K:
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :], mask=m_mask[:, None], other=0.0)
            w = tl.load(w_ptr + offs_n[:, None] * stride_wn + ks[None, :], mask=n_mask[:, None], other=0.0)
        else:
            k_mask = ks < K
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :], mask=m_mask[:, None] & k_mask[None, :],
                        other=0.0)
            w = tl.load(w_ptr + offs_n[:, None] * stride_wn + ks[None, :], mask=n_mask[:, None] & k_mask[None, :],
                        other=0.0)
        acc += tl.dot(x, tl.trans(w))
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_mask[:, None] & n_mask[None, :])


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, block_n: int = 16,
                  block_k: int = 256, num_warps: int = 4, num_stages: int = 4) -> torch.Tensor:
    """F.linear for x [M <= 16, K] with a row-major weight [N, K] (half precision: tensor-core dot products)."""
    rows, k = x.shape
    n = weight.shape[0]
    assert rows <= MAX_ROWS and x.stride(-1) == 1 and weight.stride(-1) == 1
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    _skinny_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, out, rows, n, k, x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=k % block_k == 0, BLOCK_M=MAX_ROWS, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
