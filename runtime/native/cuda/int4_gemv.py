"""The one-token product (GEMV) with INT4 weights in runtime/native/cuda/int4.py's layout, in three variants for the
A/B of issue 44 (benchmarks/gpu_int4_gemv.py):

- "v3": per weight a shift, an and, an int -> float conversion (I2F: a slow instruction on Hopper, ~16 a clock per
  SM), the zero point's subtraction, the scale's product and the FMA; zero point and scale loaded per packed word.
  7-12x its weight-bytes floor on an H200 (benchmarks/RESULTS.md, 2026-11-29): compute-bound.
- "fma": no conversion per weight. A nibble n masked in place (bits s..s+3 of the word, s = 4 * (j % 4): the upper
  four nibbles after one shift a word) and OR-ed into the bits of the float 2^23 is the float 2^23 + n * 2^s exactly;
  less 2^23 + z * 2^s (z the zero point: a constant a row, group and s) it is (n - z) * 2^s exactly, against
  x * 2^-s (a power of 2: the same product). Per weight: one LOP3, one FADD, one FFMA; the scale once a packed word
  (sum_k s (q_k - z) x_k = s sum_k (q_k - z) x_k); each x (loaded and scaled) is shared by the rows a thread holds.
- "dot": tensor cores at one token: the magic number in the activations' dtype (bf16 0x4300 | n = 128 + n) makes
  each nibble position's tile a 16-bit operand with no conversion, and tl.dot with x padded to 16 rows sums
  (128 + q) x in float32; the group's (128 + z) sum_k x_k and scale apply after. Only the masking stays on the CUDA
  cores. Needs steps of 16 words (groups of at least 128 columns); others take "fma".

A step reads WORDS packed words (8 * WORDS columns) of BLOCK_N rows, within one group (WORDS is clamped to the
group): one zero point and one scale a row a step. Nibble j of word w is column 8w + j, so no unpacked tile is ever
reshaped (a reshape cost a layout change through shared memory: 14x the floor, v2).

Split-K (SPLIT > 1): program (tile, part) sums its part's SPAN words of the tile's rows into a float32 buffer; the
last of the tile's programs to arrive adds the parts in order (runtime/native/cuda/arrivals.py): deterministic.
Llama-3.1-8B's o and down have 4096 rows, too few tiles for 132 SMs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.native.cuda.arrivals import arrived_last, counters
from runtime.native.cuda.pdl import launch_options, wait_for_previous_kernel

VARIANTS = ("v3", "fma", "dot")


@triton.jit
def _v3_span(x_ptr, q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, K: tl.constexpr, GROUPS: tl.constexpr,
             GROUP: tl.constexpr, BLOCK_N: tl.constexpr, WORDS: tl.constexpr):
    """The v3 GEMV's sums over words start .. end - 1 (module docstring): float32 [BLOCK_N]."""
    acc = tl.zeros([BLOCK_N, WORDS], tl.float32)
    for word in range(start, end, WORDS):
        words = word + tl.arange(0, WORDS)
        mask = row_mask[:, None] & (words < end)[None, :]
        packed = tl.load(q_ptr + rows.to(tl.int64)[:, None] * (K // 8) + words[None, :], mask=mask, other=0)
        group = rows.to(tl.int64)[:, None] * GROUPS + (words // (GROUP // 8))[None, :]
        zero = tl.load(z_ptr + group, mask=mask, other=0).to(tl.float32)
        scale = tl.load(s_ptr + group, mask=mask, other=0.0).to(tl.float32)
        for j in tl.static_range(8):
            x = tl.load(x_ptr + words * 8 + j, mask=words < end, other=0.0).to(tl.float32)
            acc += (((packed >> (4 * j)) & 0xF).to(tl.float32) - zero) * scale * x[None, :]
    return tl.sum(acc, axis=1)


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
def _fma_span(x_ptr, q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, packed, zero, scale, K: tl.constexpr,
              GROUPS: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, WORDS: tl.constexpr):
    """The "fma" variant's sums over words start .. end - 1 (module docstring), the first step's tile given:
    float32 [BLOCK_N]. Each step loads the next one's tile before its arithmetic (in flight meanwhile)."""
    acc = tl.zeros([BLOCK_N, WORDS], tl.float32)
    for word in range(start, end, WORDS):
        following = _step_tile(q_ptr, z_ptr, s_ptr, rows, row_mask, word + WORDS, end, K, GROUPS, GROUP, WORDS)
        cols = (word + tl.arange(0, WORDS)) * 8
        upper = packed >> 16  # nibbles 4..7 in bits 0..15 (the sign's copies above are masked off)
        dot = tl.zeros([BLOCK_N, WORDS], tl.float32)
        for j in tl.static_range(8):
            half = packed if j < 4 else upper
            # 0x4B000000 is 2^23, whose mantissa bits are the integer added to it: 2^23 + n 2^s, s = 4 (j % 4);
            # less 2^23 + z 2^s (one constant a row and s), (n - z) 2^s exactly, against x 2^-s
            magic = ((half & (0xF << (4 * (j % 4)))) | 0x4B000000).to(tl.float32, bitcast=True)
            x = tl.load(x_ptr + cols + j).to(tl.float32) * (1.0 / (1 << (4 * (j % 4))))
            dot += (magic - (8388608.0 + zero * (1 << (4 * (j % 4))))[:, None]) * x[None, :]
        acc += scale[:, None] * dot
        packed, zero, scale = following
    return tl.sum(acc, axis=1)


@triton.jit
def _magic_operand(packed, j: tl.constexpr, dtype: tl.constexpr):
    """128 + (nibble j of each word) in `dtype` (bfloat16, float16 or float32), made by bits alone."""
    if dtype == tl.bfloat16:  # 0x4300 = 128, its last mantissa bit 1
        return (((packed >> (4 * j)) & 0xF) | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
    elif dtype == tl.float16:  # 0x5800 = 128, its last mantissa bit 1/8
        return ((((packed >> (4 * j)) & 0xF) << 3) | 0x5800).to(tl.int16).to(tl.float16, bitcast=True)
    else:  # 0x43000000 = 128, bit 16 is 1
        return ((((packed >> (4 * j)) & 0xF) << 16) | 0x43000000).to(tl.float32, bitcast=True)


@triton.jit
def _dot_span(x_ptr, q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, packed, zero, scale, K: tl.constexpr,
              GROUPS: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, WORDS: tl.constexpr,
              PRECISION: tl.constexpr):
    """The "dot" variant's sums over words start .. end - 1 (module docstring), the first step's tile given:
    float32 [BLOCK_N]."""
    dtype = x_ptr.dtype.element_ty
    pad = tl.arange(0, 16)  # the dot's rows: x in row 0, zeros below
    acc = tl.zeros([16, BLOCK_N], tl.float32)
    for word in range(start, end, WORDS):
        following = _step_tile(q_ptr, z_ptr, s_ptr, rows, row_mask, word + WORDS, end, K, GROUPS, GROUP, WORDS)
        cols = (word + tl.arange(0, WORDS)) * 8
        step = tl.zeros([16, BLOCK_N], tl.float32)
        x_sum = tl.zeros([16, WORDS], tl.float32)
        for j in tl.static_range(8):
            x = tl.load(x_ptr + cols[None, :] + j + 0 * pad[:, None], mask=(pad == 0)[:, None], other=0.0)
            x_sum += x.to(tl.float32)
            step = tl.dot(x, tl.trans(_magic_operand(packed, j, dtype)), step, input_precision=PRECISION,
                          out_dtype=tl.float32)
        acc += scale[None, :] * (step - (128.0 + zero)[None, :] * tl.sum(x_sum, axis=1)[:, None])
        packed, zero, scale = following
    return tl.sum(acc, axis=0)


@triton.jit
def _int4_gemv_kernel(x_ptr, q_ptr, z_ptr, s_ptr, out_ptr, parts_ptr, arrivals_ptr, N, K: tl.constexpr,
                      GROUPS: tl.constexpr, GROUP: tl.constexpr, VARIANT: tl.constexpr, BLOCK_N: tl.constexpr,
                      WORDS: tl.constexpr, SPLIT: tl.constexpr, SPAN: tl.constexpr, PRECISION: tl.constexpr,
                      PDL: tl.constexpr):
    """out[rows] = sum over columns of (q - zero) * scale * x, by program (tile, part) over its part's SPAN words."""
    tile = tl.program_id(0)
    part = tl.program_id(1)
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    start = part * SPAN
    end = tl.minimum(start + SPAN, K // 8)
    if VARIANT != "v3":  # the weights do not depend on the kernel before: the first tile is in flight during the wait
        packed, zero, scale = _step_tile(q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, K, GROUPS, GROUP, WORDS)
    wait_for_previous_kernel(PDL)  # x is the previous kernel's output (and the counters its to reset)
    if VARIANT == "dot":
        y = _dot_span(x_ptr, q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, packed, zero, scale, K, GROUPS, GROUP,
                      BLOCK_N, WORDS, PRECISION)
    elif VARIANT == "fma":
        y = _fma_span(x_ptr, q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, packed, zero, scale, K, GROUPS, GROUP,
                      BLOCK_N, WORDS)
    else:
        y = _v3_span(x_ptr, q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, K, GROUPS, GROUP, BLOCK_N, WORDS)
    if SPLIT == 1:
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_mask)
    else:
        tl.store(parts_ptr + part * N + rows, y, mask=row_mask)
        if arrived_last(arrivals_ptr, tile, SPLIT):
            total = tl.zeros([BLOCK_N], tl.float32)
            for i in tl.static_range(SPLIT):  # .cg: from the L2, where the other programs' stores are
                total += tl.load(parts_ptr + i * N + rows, mask=row_mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=row_mask)


# the variant and its tile (BLOCK_N, WORDS, num_warps, num_stages, SPLIT; SPLIT 0: enough programs to fill the GPU,
# AUTO_PROGRAMS a multiprocessor) by the weight's (N, K), else DEFAULT. benchmarks/gpu_int4_gemv.py sweeps them.
DEFAULT: tuple[str, tuple[int, int, int, int, int]] = ("fma", (64, 16, 4, 1, 0))
SHAPES: dict[tuple[int, int], tuple[str, tuple[int, int, int, int, int]]] = {}
AUTO_PROGRAMS = 4
_multiprocessors: dict[torch.device, int] = {}


def _split(device: torch.device, tiles: int, steps: int) -> int:
    """Parts of K per tile for AUTO_PROGRAMS programs a multiprocessor (4 multiprocessors off CUDA)."""
    if device not in _multiprocessors:
        _multiprocessors[device] = (torch.cuda.get_device_properties(device).multi_processor_count
                                    if device.type == "cuda" else 4)
    return max(1, min(steps, -(-AUTO_PROGRAMS * _multiprocessors[device] // tiles)))


def int4_gemv(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
              variant: str | None = None, tile: tuple[int, int, int, int, int] | None = None,
              pdl: bool = False) -> torch.Tensor:
    """x [1, K] (contiguous) times the INT4 weight: [1, N] in x's dtype. `variant`/`tile`: else SHAPES' or DEFAULT's
    ("dot" takes "fma" where the groups are under 128 columns)."""
    n, groups = scales.shape
    k = x.shape[1]
    group = k // groups
    chosen_variant, chosen_tile = SHAPES.get((n, k), DEFAULT)
    variant, (block_n, words, warps, stages, split) = variant or chosen_variant, tile or chosen_tile
    assert variant in VARIANTS, variant
    if variant != "v3":
        words = min(words, group // 8)  # a step within one group
        if variant == "dot" and words < 16:
            variant = "fma"
    tiles, steps = triton.cdiv(n, block_n), triton.cdiv(k // 8, words)
    split = min(split or _split(x.device, tiles, steps), steps)
    span = triton.cdiv(steps, split) * words
    split = triton.cdiv(k // 8, span)  # no part left empty
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    parts = torch.empty((split, n), dtype=torch.float32, device=x.device) if split > 1 else out
    arrivals = counters(x.device, tiles) if split > 1 else out
    _int4_gemv_kernel[(tiles, split)](
        x, qweight, zeros, scales, out, parts, arrivals, n, K=k, GROUPS=groups, GROUP=group, VARIANT=variant,
        BLOCK_N=block_n, WORDS=words, SPLIT=split, SPAN=span,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", PDL=pdl, num_warps=warps, num_stages=stages,
        **launch_options(pdl))
    return out
