"""The one-token product (GEMV) with INT4 weights in runtime/native/cuda/int4.py's layout, with no int -> float
conversion (I2F: a slow instruction on Hopper). A nibble n masked in place (bits s..s+3 of the word, s = 4 (j % 4):
the upper four nibbles after one shift a word) and OR-ed into the bits of the float 2^23 is the float 2^23 + n 2^s
exactly; less 2^23 + z 2^s (z the zero point: a constant a row, group and s) it is (n - z) 2^s exactly, against
x 2^-s (a power of 2: the same product). Per weight one LOP3, one FADD, one FFMA (6 instructions a weight in the
compiled step loop at 64 x 16 words, sm_90 bf16, Triton 3.6); the scale once a packed word. Issue 44's A/B on an
H200 (benchmarks/RESULTS.md, 2026-11-29) kept it against a conversion per weight (3.5x its time) and tensor-core
variants (tl.dot of magic-number operands: fewer instructions a weight, slower).

A step reads WORDS packed words (8 WORDS columns) of BLOCK_N rows, within one group (WORDS is clamped to the group):
one zero point and one scale a row a step. Each step loads the one AHEAD steps on before its arithmetic, the first
ones before the programmatic-launch wait (weights do not depend on the kernel before).

Split-K (SPLIT > 1 parts): program (tile, part) sums its part's words of the tile's rows into a float32 buffer; the
last of the tile's programs to arrive adds the parts in order (runtime/native/cuda/arrivals.py): deterministic.
Llama-3.1-8B's o and down have 4096 rows, 32 tiles of 128 for 132 multiprocessors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.native.cuda.arrivals import arrived_last, counters
from runtime.native.cuda.pdl import launch_options, wait_for_previous_kernel

# the float32 2^23 OR-ed onto masked nibbles. A kernel argument, not a constant: ptxas rematerialized the immediate
# into a register before each LOP3 that takes it with the mask (one MOV for every two weights in the compiled loop)
MAGIC = 0x4B000000


@triton.jit
def _step_tile(q_ptr, z_ptr, s_ptr, rows, row_mask, word, end, K: tl.constexpr, GROUPS: tl.constexpr,
               GROUP: tl.constexpr, WORDS: tl.constexpr):
    """Packed words word .. word + WORDS - 1 of `rows` (int32 [BLOCK_N, WORDS], all in one group) and that group's
    zero point and scale of each row (float32 [BLOCK_N]); zeros from `end` on (a step past the part's end)."""
    mask = row_mask & (rows * 0 + word < end)
    words = word + tl.arange(0, WORDS)
    packed = tl.load(q_ptr + rows.to(tl.int64)[:, None] * (K // 8) + words[None, :], mask=mask[:, None], other=0)
    group = rows.to(tl.int64) * GROUPS + word // (GROUP // 8)
    zero = tl.load(z_ptr + group, mask=mask, other=0).to(tl.float32)
    scale = tl.load(s_ptr + group, mask=mask, other=0.0).to(tl.float32)
    return packed, zero, scale


@triton.jit
def _span(magic, x_ptr, q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, step, following, K: tl.constexpr,
          GROUPS: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, WORDS: tl.constexpr, AHEAD: tl.constexpr):
    """The sums over words start .. end - 1 (module docstring): float32 [BLOCK_N]. `step` is the first step's
    _step_tile, `following` the second's where AHEAD is 2: each step loads the tile AHEAD steps on before its
    arithmetic (in flight meanwhile)."""
    acc = tl.zeros([BLOCK_N, WORDS], tl.float32)
    for word in range(start, end, WORDS):
        later = _step_tile(q_ptr, z_ptr, s_ptr, rows, row_mask, word + AHEAD * WORDS, end, K, GROUPS, GROUP, WORDS)
        packed, zero, scale = step
        cols = (word + tl.arange(0, WORDS)) * 8
        upper = packed >> 16  # nibbles 4..7 in bits 0..15 (the sign's copies above are masked off)
        dot = tl.zeros([BLOCK_N, WORDS], tl.float32)
        for j in tl.static_range(8):
            half = packed if j < 4 else upper
            # magic 0x4B000000 is 2^23, whose mantissa bits are the integer added to it: 2^23 + n 2^s, s = 4 (j % 4);
            # less 2^23 + z 2^s (one constant a row and s), (n - z) 2^s exactly, against x 2^-s
            nibble = ((half & (0xF << (4 * (j % 4)))) | magic).to(tl.float32, bitcast=True)
            x = tl.load(x_ptr + cols + j).to(tl.float32) * (1.0 / (1 << (4 * (j % 4))))
            dot += (nibble - (8388608.0 + zero * (1 << (4 * (j % 4))))[:, None]) * x[None, :]
        acc += scale[:, None] * dot
        if AHEAD == 2:
            step, following = following, later
        else:
            step = later
    return tl.sum(acc, axis=1)


@triton.jit
def _int4_gemv_kernel(x_ptr, q_ptr, z_ptr, s_ptr, out_ptr, parts_ptr, arrivals_ptr, N, magic, n_parts, span,
                      K: tl.constexpr, GROUPS: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                      WORDS: tl.constexpr, AHEAD: tl.constexpr, SPLIT_K: tl.constexpr, PDL: tl.constexpr):
    """out[rows] = sum over columns of (q - zero) * scale * x, by program (tile, part) over its part's `span` words
    (of n_parts; SPLIT_K: more than one. Run-time values: a split does not compile a kernel of its own)."""
    tile = tl.program_id(0)
    part = tl.program_id(1)
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    start = part * span
    end = tl.minimum(start + span, K // 8)
    # the weights do not depend on the kernel before: the first tiles are in flight during the wait
    first = _step_tile(q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, K, GROUPS, GROUP, WORDS)
    following = first
    if AHEAD == 2:
        following = _step_tile(q_ptr, z_ptr, s_ptr, rows, row_mask, start + WORDS, end, K, GROUPS, GROUP, WORDS)
    wait_for_previous_kernel(PDL)  # x is the previous kernel's output (and the counters its to reset)
    y = _span(magic, x_ptr, q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, first, following, K, GROUPS, GROUP,
              BLOCK_N, WORDS, AHEAD)
    if not SPLIT_K:
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_mask)
    else:
        tl.store(parts_ptr + part * N + rows, y, mask=row_mask)
        if arrived_last(arrivals_ptr, tile, n_parts):
            total = tl.zeros([BLOCK_N], tl.float32)
            for i in range(n_parts):  # .cg: from the L2, where the other programs' stores are
                total += tl.load(parts_ptr + i * N + rows, mask=row_mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=row_mask)


# the tile (BLOCK_N, WORDS, num_warps, AHEAD, SPLIT; SPLIT 0: AUTO_PROGRAMS programs a multiprocessor, split-K where
# the tiles alone are fewer) by the weight's (N, K), else DEFAULT: the fastest of benchmarks/gpu_int4_gemv.py's sweep
# per Llama-3.1-8B projection on an H200 (RESULTS.md, 2026-11-29; gate_up's 64 and 128 rows 0.3% apart)
DEFAULT = (128, 16, 4, 1, 0)
SHAPES: dict[tuple[int, int], tuple[int, int, int, int, int]] = {(28672, 4096): (64, 16, 4, 1, 0)}
AUTO_PROGRAMS = 4
_multiprocessors: dict[torch.device, int] = {}


def _split(device: torch.device, tiles: int, steps: int) -> int:
    """Parts of K per tile for AUTO_PROGRAMS programs a multiprocessor (4 multiprocessors off CUDA)."""
    if device not in _multiprocessors:
        _multiprocessors[device] = (torch.cuda.get_device_properties(device).multi_processor_count
                                    if device.type == "cuda" else 4)
    return max(1, min(steps, -(-AUTO_PROGRAMS * _multiprocessors[device] // tiles)))


def int4_gemv(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
              tile: tuple[int, int, int, int, int] | None = None, pdl: bool = False) -> torch.Tensor:
    """x [1, K] (contiguous) times the INT4 weight: [1, N] in x's dtype. `tile`: else SHAPES' or DEFAULT."""
    n, groups = scales.shape
    k = x.shape[1]
    group = k // groups
    block_n, words, warps, ahead, split = tile or SHAPES.get((n, k), DEFAULT)
    words = min(words, group // 8)  # a step within one group
    tiles, steps = triton.cdiv(n, block_n), triton.cdiv(k // 8, words)
    split = min(split or _split(x.device, tiles, steps), steps)
    span = triton.cdiv(steps, split) * words
    split = triton.cdiv(k // 8, span)  # no part left empty
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    parts = torch.empty((split, n), dtype=torch.float32, device=x.device) if split > 1 else out
    arrivals = counters(x.device, tiles) if split > 1 else out
    _int4_gemv_kernel[(tiles, split)](
        x, qweight, zeros, scales, out, parts, arrivals, n, MAGIC, split, span, K=k, GROUPS=groups, GROUP=group,
        BLOCK_N=block_n, WORDS=words, AHEAD=ahead, SPLIT_K=split > 1, PDL=pdl, num_warps=warps, num_stages=1,
        **launch_options(pdl))
    return out
