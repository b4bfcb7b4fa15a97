"""Products with INT4 weight-only weights (AWQ/GPTQ, runtime/native/models/int4_checkpoint.py) that dequantize in
registers: a GEMV for one-token steps (runtime/native/cuda/int4_gemv.py) and a tiled GEMM (tensor cores through
tl.dot) for steps of several rows.

Both read one layout, to which the loader repacks either format (int4_checkpoint.py's `kernel_layout`):
output-major, so fused parts stack along dim 0 as 16-bit weights do. `qweight` int32 [N, K/8], input column 8i + j of
row n in bits 4j of qweight[n, i]; `scales` [N, K/group] in the activations' dtype; `zeros` uint8 [N, K/group] (the
true zero points, 0..15). Groups are contiguous runs of a power of 2 (at least 16) input columns; GPTQ's act-order
checkpoints and other groups are dequantized at load (int4_checkpoint.kernel_group).
W[n, k] = (q[n, k] - zeros[n, k // group]) * scales[n, k // group].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.native.cuda import pdl
from runtime.native.cuda.int4_gemv import TILE_ROWS, int4_gemv, stored_group, stored_words


def tile_major(qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The output-major tensors ([N, K/8], [N, groups] twice) in the kernels' tile-major layout (module docstring)."""
    n, groups = zeros.shape
    tiles = -(-n // TILE_ROWS)

    def by_tile(t: torch.Tensor, per_group: int) -> torch.Tensor:
        padded = torch.zeros((tiles * TILE_ROWS, t.shape[1]), dtype=t.dtype, device=t.device)
        padded[:n] = t
        return padded.view(tiles, TILE_ROWS, groups, per_group).transpose(1, 2).contiguous()

    return (by_tile(qweight, qweight.shape[1] // groups), by_tile(zeros, 1).squeeze(3),
            by_tile(scales, 1).squeeze(3))


@triton.jit
def _nibbles(q_ptr, first, local, row_mask, word, GROUPS: tl.constexpr, GROUP: tl.constexpr, BLOCK_K: tl.constexpr):
    """Columns 8 * word .. 8 * word + BLOCK_K - 1 (within one group) of rows first + local as int32 [BLOCK_N, BLOCK_K]:
    each packed int32 read once, its eight nibbles split by shifts (input column 8i + j is bits 4j of word i)."""
    words = stored_words(first, word, GROUPS, GROUP, BLOCK_K // 8) + local[:, None] * (GROUP // 8)
    packed = tl.load(q_ptr + words + tl.arange(0, BLOCK_K // 8), mask=row_mask[:, None], other=0)
    q = (packed[:, :, None] >> (tl.arange(0, 8) * 4)[None, None, :]) & 0xF
    return tl.reshape(q, [local.shape[0], BLOCK_K])


@triton.jit
def _int4_gemm_kernel(x_ptr, q_ptr, z_ptr, s_ptr, out_ptr, M, N, K: tl.constexpr, GROUPS: tl.constexpr,
                      GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      PRECISION: tl.constexpr):
    """Tensor-core tiles: each weight tile dequantized once in registers (BLOCK_K divides GROUP: one zero point and
    scale per row of the tile) for BLOCK_M tokens."""
    dtype = x_ptr.dtype.element_ty
    tokens = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    first = tl.program_id(1) * BLOCK_N
    local = tl.arange(0, BLOCK_N)
    rows = first + local
    token_mask, row_mask = tokens < M, rows < N
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + tokens.to(tl.int64)[:, None] * K + (k + cols)[None, :], mask=token_mask[:, None], other=0.0)
        group = stored_group(first, k // GROUP, GROUPS) + local
        zero = tl.load(z_ptr + group, mask=row_mask, other=0).to(tl.float32)
        scale = tl.load(s_ptr + group, mask=row_mask, other=0.0).to(tl.float32)
        q = _nibbles(q_ptr, first, local, row_mask, k // 8, GROUPS, GROUP, BLOCK_K).to(tl.float32)
        w = ((q - zero[:, None]) * scale[:, None]).to(dtype)
        acc += tl.dot(x, tl.trans(w), input_precision=PRECISION, out_dtype=tl.float32)
    tl.store(out_ptr + tokens.to(tl.int64)[:, None] * N + rows[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=token_mask[:, None] & row_mask[None, :])


# The GEMM's (BLOCK_N, BLOCK_K, warps, stages) and its BLOCK_M by the number of rows: the best of
# benchmarks/gpu_quant.py's INT4_GEMM_TILES on an H200 (RESULTS.md, 2026-11-29). The GEMM unpacks a tile by a
# reshape (one tl.dot per nibble position, as the GEMV reads them, took 4x as long)
GEMM_TILE = (128, 64, 4, 3)


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, n: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (contiguous) times the INT4 weight of N rows in this module's (tile-major) layout: [M, N] in x's
    dtype, float32 sums (full float32 products for float32 x, the reference math). One row takes the GEMV, more the
    GEMM."""
    m, k = x.shape
    groups = zeros.shape[1]
    group = k // groups
    assert qweight.shape == (-(-n // TILE_ROWS), groups, TILE_ROWS, group // 8) and group * groups == k
    assert x.is_contiguous()
    if m == 1:
        out = int4_gemv(x, qweight, zeros, scales, n, pdl=pdl.ENABLED)
    else:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        shape = dict(K=k, GROUPS=groups, GROUP=group)
        block_n, block_k, warps, stages = GEMM_TILE
        assert TILE_ROWS % block_n == 0
        block_m = 16 if m <= 16 else 32 if m <= 32 else 64
        _int4_gemm_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n))](
            x, qweight, zeros, scales, out, m, n, **shape, BLOCK_M=block_m, BLOCK_N=block_n,
            BLOCK_K=min(block_k, group), PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=warps,
            num_stages=stages)
    return out if bias is None else out + bias
