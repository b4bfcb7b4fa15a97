"""One-token projections (GEMV) for the batch-1 decode step, with the elementwise work around them fused in.

Why: a batch-1 step of a 1B Llama is 16 layers of matrix-vector products of 8-67 MB each. cuBLAS reaches
1.6-1.7 TB/s on the 8-12 MB ones (q/k/v, o) and adds a split-K reduce kernel to `down`, and every RMSNorm,
residual add and SwiGLU between them is a kernel of its own, 1-2 us each (H100, benchmarks/RESULTS.md). Here a
program owns BLOCK_N output rows and reads their whole K span, so the input's prologue and the output's epilogue
fit in the same kernel:

- NORM: the input is RMSNorm(x) * norm_weight, computed from x in each program (x is a few KB, read from L2 in
  one load for its 1 / rms: a loop of BLOCK_K-wide loads paid an L2 round trip each before the first product);
- GLU: the weight is a fused gate/up [2I, K] and the output silu(gate) * up [I]: a program's rows are gate and up
  rows in turn, so it holds matching pairs and writes the SwiGLU once (the down projection after it then reads I
  values, not 2I, and computes no exponentials: each of its programs did, over the whole row);
- RESIDUAL: the output is residual + W x, the residual stream's next value.

FP8 weights (runtime/native/models/fp8.py) take `scale`: the kernel reads E4M3 weights (half the bytes of 16-bit ones), widens
them to float32 against the 16-bit input as it is, and multiplies each output row's sum by its scale.

Each rounds to the activation dtype where the eager modules do (runtime/native/cuda/fused.py's kernels), so only the
order of the dot product's float32 sums differs from cuBLAS. With `pdl` (runtime/native/cuda/pdl.py) the kernel starts
while the one before it drains: its first weight tile is loaded before it waits for that kernel's output.

Steps of 2 to MAX_TOKENS tokens (a sequence's verification rows, a small batch) run `_gemv_tokens_kernel`: each
weight tile is loaded once for all of them, and each token gets _gemv_kernel's products and sums in _gemv_kernel's
order, the same tile: its bits are those of a call for it alone, so verification and plain decoding agree in 16
bits. (An earlier form, this kernel run once per row with a tile's rows side by side to share loads through L2, was
slower than cuBLAS past 2 rows on the H100: benchmarks/RESULTS.md, 2026-11-27.) Longer steps keep cuBLAS.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.native.cuda.moe import gated
from runtime.native.cuda.pdl import launch_options, wait_for_previous_kernel

# (BLOCK_N, BLOCK_K, num_warps) by the weight's (N, K); others get DEFAULT_TILE. Chosen by benchmarks/gemv_kernels.py.
# H100, 2026-11-27: Llama-3.2-1B's q/k/v, o, gate/up, down and output embedding. H200, PDL launches: 2026-11-28,
# Llama-3.1-8B's o (Qwen3-8B's too) and output embedding (DEFAULT_TILE was the best for Llama-3.1-8B's q/k/v, Qwen3-8B's
# too, gate/up and down, and Qwen3-8B's gate/up); 2026-11-29, Qwen3-30B-A3B's router (128, 2048), in the graphed step
# (2.552 -> 2.541 ms). That day the sweep's best tiles for the 30B's q/k/v (8, 512, 4) and o (2, 1024, 4), faster
# alone in a chain of their own launches (7.66 -> 6.65, 6.02 -> 5.29 us), made the graphed step 0.17 ms slower: they
# stay on DEFAULT_TILE (benchmarks/RESULTS.md). Not swept yet: Qwen3-8B's down and output embedding. 2026-11-30, with
# the SwiGLU moved into gate/up's epilogue, the 1B's down (8, 4096, 8) in its graphed step: 0.853 -> 0.827 ms.
TILES: dict[tuple[int, int], tuple[int, int, int]] = {
    (3072, 2048): (8, 2048, 4), (2048, 2048): (2, 1024, 8), (16384, 2048): (4, 1024, 4), (2048, 8192): (8, 4096, 8),
    (128256, 2048): (2, 1024, 4), (4096, 4096): (8, 512, 8), (128256, 4096): (16, 256, 4), (128, 2048): (1, 2048, 4)}
DEFAULT_TILE = (4, 1024, 4)
MAX_TOKENS = 4  # tokens a call may bring (a few accumulators a token, held in registers)
# float32 accumulators a thread may hold over a call's tokens (BLOCK_N x BLOCK_K / threads each): past it the tokens
# kernel lost to cuBLAS (H200, 2026-11-29, benchmarks/few_token_step.py, a whole step: SmolLM2-135M's tiles, 32 a
# token, 2 / 3 / 4 tokens 0.66 / 0.77 / 0.95 ms against cuBLAS's 0.92 / 0.93 / 0.92 and one token's 0.61;
# Llama-3.2-1B's q/k/v tile, 128 a token: 2 tokens 1.17 ms against 1.03)
ACCUMULATORS = 96
# FP8 weights' own tiles where they differ (half the bytes a row, so other tiles keep as many bytes in flight): for
# Llama-3.1-8B's shapes the best of a sweep with each projection's step flags (q/k/v and gate/up with the RMSNorm
# prologue, o and down with the residual epilogue, down with the SwiGLU prologue; PDL) on the H200, 2026-11-30, whose
# tiles made the graphed batch-1 step 2.867 -> 2.707 ms (benchmarks/RESULTS.md); others: TILES. With the SwiGLU moved
# into gate/up's epilogue (2.705 -> 2.645 ms) none of 10 other gate/up or down tiles did better in the step.
FP8_TILES: dict[tuple[int, int], tuple[int, int, int]] = {
    (6144, 4096): (8, 512, 4),  # q/k/v: 12.05 -> 10.90 us
    (4096, 4096): (8, 1024, 4),  # o: 11.11 -> 7.31
    (28672, 4096): (16, 256, 4),  # gate/up: (8, 4096, 8) was fastest alone; in the step 2.740 -> 2.707 ms
    (4096, 14336): (8, 1024, 4),  # down: 21.91 -> 20.25
}


def rstd_block(k: int) -> int:
    """input_rstd's load width for an input of k values: all of them at once, up to 8,192 (32 a thread at 256)."""
    return min(triton.next_power_of_2(k), 8192)


@triton.jit
def input_rstd(x_ptr, eps, K: tl.constexpr, RSTD_BLOCK: tl.constexpr):
    """1 / rms(x) of the projection's input x [K], float32: the NORM prologue's scale (RSTD_BLOCK: rstd_block(K))."""
    offs = tl.arange(0, RSTD_BLOCK)
    squares = tl.zeros([RSTD_BLOCK], tl.float32)
    for k in range(0, K, RSTD_BLOCK):
        v = tl.load(x_ptr + k + offs, mask=k + offs < K, other=0.0).to(tl.float32)
        squares += v * v
    return 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps)


@triton.jit
def input_tile(x_ptr, norm_ptr, cols, col_mask, rstd, dtype: tl.constexpr, NORM: tl.constexpr):
    """The projection's input at `cols`, float32, after the fused prologue (rounded to `dtype` where eager is)."""
    v = tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    if NORM:
        h = (v * rstd).to(dtype)  # cast back before the weight, as HF Llama
        v = (tl.load(norm_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) * h.to(tl.float32)).to(dtype)
    return v.to(tl.float32)


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, out_ptr, res_ptr, norm_ptr, bias_ptr, scale_ptr, eps, N,
    K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, RSTD_BLOCK: tl.constexpr,
    NORM: tl.constexpr, GLU: tl.constexpr, RESIDUAL: tl.constexpr, BIAS: tl.constexpr, SCALED: tl.constexpr,
    PDL: tl.constexpr,
):
    dtype = x_ptr.dtype.element_ty  # the activations' dtype (out may be float32 logits; the weight FP8)
    rows, row_mask = weight_rows(N, BLOCK_N, GLU)
    offs = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * K
    # the first weight tile does not depend on the kernel before: its load is in flight during the wait
    w = tl.load(w_rows + offs[None, :], mask=row_mask[:, None] & (offs < K)[None, :], other=0.0)
    wait_for_previous_kernel(PDL)  # the input is the previous kernel's output
    rstd = 0.0
    if NORM:
        rstd = input_rstd(x_ptr, eps, K, RSTD_BLOCK)
    acc = w.to(tl.float32) * input_tile(x_ptr, norm_ptr, offs, offs < K, rstd, dtype, NORM)[None, :]
    for k in range(BLOCK_K, K, BLOCK_K):
        cols = k + offs
        col_mask = cols < K
        w = tl.load(w_rows + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        acc += w.to(tl.float32) * input_tile(x_ptr, norm_ptr, cols, col_mask, rstd, dtype, NORM)[None, :]
    store_sums(acc, rows, row_mask, N, out_ptr, res_ptr, bias_ptr, scale_ptr, dtype, GLU, RESIDUAL, BIAS, SCALED)


@triton.jit
def weight_rows(N, BLOCK_N: tl.constexpr, GLU: tl.constexpr):
    """The weight rows of this program's tile and their mask. GLU: rows 2j and 2j + 1 of the tile are the gate row
    and the up row of output j (gate rows are the weight's first N / 2, up rows the rest)."""
    tile = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    if GLU:
        return tile // 2 + (tile % 2) * (N // 2), tile < N
    return tile, tile < N


@triton.jit
def store_sums(acc, rows, row_mask, N, out_ptr, res_ptr, bias_ptr, scale_ptr, dtype: tl.constexpr,
               GLU: tl.constexpr, RESIDUAL: tl.constexpr, BIAS: tl.constexpr, SCALED: tl.constexpr):
    """One token's outputs from its products `acc` [BLOCK_N, BLOCK_K] at weight rows `rows`: their sums and the
    epilogue (GLU: the SwiGLU of each gate/up pair, rounded as the eager ops, at out[row of the pair's gate])."""
    out = tl.sum(acc, axis=1)
    if SCALED:  # FP8 weights: each row's scale, on the float32 sum
        out *= tl.load(scale_ptr + rows, mask=row_mask, other=0.0)
    if BIAS:
        out += tl.load(bias_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    if GLU:
        pairs: tl.constexpr = acc.shape[0] // 2
        gate, up = tl.split(tl.reshape(out.to(dtype).to(tl.float32), (pairs, 2)))
        outputs, _ = tl.split(tl.reshape(rows, (pairs, 2)))  # the gate rows: 0 to N / 2
        tl.store(out_ptr + outputs, gated(gate, up, 0.0, 0.0, dtype, False), mask=outputs < N // 2)
    else:
        if RESIDUAL:  # the projection rounded, then the add rounded: as the eager add of two activations
            out = out.to(dtype).to(tl.float32) + tl.load(res_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, out.to(dtype).to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _gemv_tokens_kernel(
    x_ptr, w_ptr, out_ptr, res_ptr, norm_ptr, bias_ptr, scale_ptr, eps, N, x_stride, out_stride, res_stride,
    TOKENS: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, RSTD_BLOCK: tl.constexpr,
    NORM: tl.constexpr, GLU: tl.constexpr, RESIDUAL: tl.constexpr, BIAS: tl.constexpr, SCALED: tl.constexpr,
    PDL: tl.constexpr,
):
    """_gemv_kernel for 2-4 tokens: each weight tile is read once for all of them, and each token's products and
    sums are _gemv_kernel's, in its order (token t's rows at x_ptr + t * x_stride, and so on)."""
    dtype = x_ptr.dtype.element_ty
    rows, row_mask = weight_rows(N, BLOCK_N, GLU)
    offs = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * K
    w = tl.load(w_rows + offs[None, :], mask=row_mask[:, None] & (offs < K)[None, :], other=0.0)
    wait_for_previous_kernel(PDL)
    x1, x2, x3 = x_ptr + x_stride, x_ptr + 2 * x_stride, x_ptr + 3 * x_stride
    rstd0, rstd1, rstd2, rstd3 = 0.0, 0.0, 0.0, 0.0
    if NORM:
        rstd0 = input_rstd(x_ptr, eps, K, RSTD_BLOCK)
        rstd1 = input_rstd(x1, eps, K, RSTD_BLOCK)
        if TOKENS > 2:
            rstd2 = input_rstd(x2, eps, K, RSTD_BLOCK)
        if TOKENS > 3:
            rstd3 = input_rstd(x3, eps, K, RSTD_BLOCK)
    first = offs < K
    acc0 = w.to(tl.float32) * input_tile(x_ptr, norm_ptr, offs, first, rstd0, dtype, NORM)[None, :]
    acc1 = w.to(tl.float32) * input_tile(x1, norm_ptr, offs, first, rstd1, dtype, NORM)[None, :]
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    if TOKENS > 2:
        acc2 = w.to(tl.float32) * input_tile(x2, norm_ptr, offs, first, rstd2, dtype, NORM)[None, :]
    if TOKENS > 3:
        acc3 = w.to(tl.float32) * input_tile(x3, norm_ptr, offs, first, rstd3, dtype, NORM)[None, :]
    for k in range(BLOCK_K, K, BLOCK_K):
        cols = k + offs
        col_mask = cols < K
        w = tl.load(w_rows + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        acc0 += w.to(tl.float32) * input_tile(x_ptr, norm_ptr, cols, col_mask, rstd0, dtype, NORM)[None, :]
        acc1 += w.to(tl.float32) * input_tile(x1, norm_ptr, cols, col_mask, rstd1, dtype, NORM)[None, :]
        if TOKENS > 2:
            acc2 += w.to(tl.float32) * input_tile(x2, norm_ptr, cols, col_mask, rstd2, dtype, NORM)[None, :]
        if TOKENS > 3:
            acc3 += w.to(tl.float32) * input_tile(x3, norm_ptr, cols, col_mask, rstd3, dtype, NORM)[None, :]
    store_sums(acc0, rows, row_mask, N, out_ptr, res_ptr, bias_ptr, scale_ptr, dtype, GLU, RESIDUAL, BIAS, SCALED)
    store_sums(acc1, rows, row_mask, N, out_ptr + out_stride, res_ptr + res_stride, bias_ptr, scale_ptr, dtype,
               GLU, RESIDUAL, BIAS, SCALED)
    if TOKENS > 2:
        store_sums(acc2, rows, row_mask, N, out_ptr + 2 * out_stride, res_ptr + 2 * res_stride, bias_ptr, scale_ptr,
                   dtype, GLU, RESIDUAL, BIAS, SCALED)
    if TOKENS > 3:
        store_sums(acc3, rows, row_mask, N, out_ptr + 3 * out_stride, res_ptr + 3 * res_stride, bias_ptr, scale_ptr,
                   dtype, GLU, RESIDUAL, BIAS, SCALED)


def _tile(n: int, k: int, fp8: bool) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps) of a [n, k] weight."""
    block_n, block_k, warps = (fp8 and FP8_TILES.get((n, k))) or TILES.get((n, k), DEFAULT_TILE)
    return block_n, min(block_k, triton.next_power_of_2(k)), warps


def takes_tokens(weight: torch.Tensor, tokens: int) -> bool:
    """Whether a call of `tokens` tokens over `weight` stays within ACCUMULATORS (one token always does)."""
    block_n, block_k, warps = _tile(*weight.shape, weight.element_size() == 1)
    return tokens == 1 or (tokens <= MAX_TOKENS and tokens * block_n * block_k <= ACCUMULATORS * 32 * warps)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         norm: tuple[torch.Tensor, float] | None = None, glu: bool = False,
         residual: torch.Tensor | None = None, pdl: bool = False, out: torch.Tensor | None = None,
         scale: torch.Tensor | None = None) -> torch.Tensor:
    """y = W f(x) (+ bias) (+ residual) for 1 to MAX_TOKENS tokens: x [T, K], weight [N, K] -> [T, N]; each token's y
    has the bits a call for it alone gives (faster than cuBLAS only where takes_tokens). f is RMSNorm with `norm` =
    (norm weight, eps), else the identity. `glu`: W is a fused gate/up and y = silu(y[:, :N/2]) * y[:, N/2:], [T, N/2]
    (no residual). `out`: where to write y (a float32 one gets y rounded to the activations' dtype first, as a cast of
    F.linear's output). `scale`: float32 [N] row scales of an FP8 weight (W = weight * scale[:, None])."""
    n, k = weight.shape
    tokens = x.shape[0]
    width = n // 2 if glu else n
    assert 1 <= tokens <= MAX_TOKENS and x.stride(-1) == 1, "1 to MAX_TOKENS tokens, rows contiguous"
    assert (scale is None) == (weight.element_size() != 1), "FP8 weights come with their row scales"
    assert not glu or (n % 2 == 0 and residual is None), "gate/up pairs, no residual"
    if out is None:
        out = torch.empty((tokens, width), dtype=x.dtype, device=weight.device)
    assert out.shape == (tokens, width) and out.stride(-1) == 1
    assert residual is None or (residual.shape == (tokens, n) and residual.stride(-1) == 1)
    block_n, block_k, warps = _tile(n, k, scale is not None)
    assert not glu or block_n % 2 == 0, "gate/up pairs fill a tile"
    norm_weight, eps = norm if norm is not None else (weight, 0.0)
    args = (x, weight, out, residual if residual is not None else out, norm_weight,
            bias if bias is not None else weight, scale if scale is not None else weight, eps, n)
    flags = dict(K=k, BLOCK_N=block_n, BLOCK_K=block_k, RSTD_BLOCK=rstd_block(k), NORM=norm is not None,
                 GLU=glu, RESIDUAL=residual is not None, BIAS=bias is not None, SCALED=scale is not None, PDL=pdl,
                 num_warps=warps, **launch_options(pdl))
    grid = (triton.cdiv(n, block_n),)
    if tokens == 1:
        _gemv_kernel[grid](*args, **flags)
    else:
        _gemv_tokens_kernel[grid](*args, x.stride(0), out.stride(0),
                                  residual.stride(0) if residual is not None else 0, TOKENS=tokens, **flags)
    return out
