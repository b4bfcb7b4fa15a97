"""Products with INT4 weight-only weights (AWQ/GPTQ, runtime/native/models/int4_checkpoint.py) that dequantize in
registers: a GEMV for one-token steps and a tiled GEMM (tensor cores through tl.dot) for steps of several rows.

Both read one layout, to which the loader repacks either format (int4_checkpoint.py's `kernel_layout`): output-major, so fused parts stack along
dim 0 as 16-bit weights do. `qweight` int32 [N, K/8], input column 8i + j of row n in bits 4j of qweight[n, i];
`scales` [N, K/group] in the activations' dtype; `zeros` uint8 [N, K/group] (the true zero points, 0..15). Groups are
contiguous runs of input columns (GPTQ's act-order checkpoints are dequantized at load instead). W[n, k] = (q[n, k] - zeros[n, k // group]) * scales[...].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _dequantized_tile(q_ptr, z_ptr, s_ptr, rows, row_mask, cols, col_mask, K: tl.constexpr, GROUPS: tl.constexpr,
                      GROUP: tl.constexpr):
    """W[rows, cols] in float32, [BLOCK_N, BLOCK_K], from the packed values (each int32 read once per nibble: the
    repeated loads hit the cache)."""
    mask = row_mask[:, None] & col_mask[None, :]
    packed = tl.load(q_ptr + rows.to(tl.int64)[:, None] * (K // 8) + (cols // 8)[None, :], mask=mask, other=0)
    q = (packed >> ((cols % 8) * 4)[None, :]) & 0xF
    group = rows.to(tl.int64)[:, None] * GROUPS + (cols // GROUP)[None, :]
    zero = tl.load(z_ptr + group, mask=mask, other=0).to(tl.float32)
    scale = tl.load(s_ptr + group, mask=mask, other=0.0).to(tl.float32)
    return (q.to(tl.float32) - zero) * scale


@triton.jit
def _int4_gemv_kernel(x_ptr, q_ptr, z_ptr, s_ptr, out_ptr, N, K: tl.constexpr, GROUPS: tl.constexpr,
                      GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    offs = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k in range(0, K, BLOCK_K):
        cols = k + offs
        col_mask = cols < K
        w = _dequantized_tile(q_ptr, z_ptr, s_ptr, rows, row_mask, cols, col_mask, K, GROUPS, GROUP)
        acc += w * tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _int4_gemm_kernel(x_ptr, q_ptr, z_ptr, s_ptr, out_ptr, M, N, K: tl.constexpr, GROUPS: tl.constexpr,
                      GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      PRECISION: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    tokens = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    token_mask, row_mask = tokens < M, rows < N
    offs = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, K, BLOCK_K):
        cols = k + offs
        col_mask = cols < K
        x = tl.load(x_ptr + tokens.to(tl.int64)[:, None] * K + cols[None, :],
                    mask=token_mask[:, None] & col_mask[None, :], other=0.0)
        w = _dequantized_tile(q_ptr, z_ptr, s_ptr, rows, row_mask, cols, col_mask, K, GROUPS, GROUP)
        acc += tl.dot(x, tl.trans(w.to(dtype)), input_precision=PRECISION, out_dtype=tl.float32)
    tl.store(out_ptr + tokens.to(tl.int64)[:, None] * N + rows[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=token_mask[:, None] & row_mask[None, :])


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (contiguous) times the INT4 weight in this module's layout: [M, N] in x's dtype, float32 sums
    (full float32 products for float32 x, the reference math). One row takes the GEMV, more the GEMM."""
    m, k = x.shape
    n, groups = scales.shape
    assert qweight.shape == (n, k // 8) and k % 8 == 0 and x.is_contiguous()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    shape = dict(K=k, GROUPS=groups, GROUP=k // groups)
    if m == 1:
        block_n = 8
        _int4_gemv_kernel[(triton.cdiv(n, block_n),)](x, qweight, zeros, scales, out, n, **shape, BLOCK_N=block_n,
                                                      BLOCK_K=min(256, triton.next_power_of_2(k)))
    else:
        block_m, block_n = 16, 64
        _int4_gemm_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n))](
            x, qweight, zeros, scales, out, m, n, **shape, BLOCK_M=block_m, BLOCK_N=block_n,
            BLOCK_K=min(64, triton.next_power_of_2(k)), PRECISION="ieee" if x.dtype == torch.float32 else "tf32")
    return out if bias is None else out + bias
