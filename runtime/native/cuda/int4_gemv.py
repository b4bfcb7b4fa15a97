"""The one-token product (GEMV) with INT4 weights in runtime/native/cuda/int4.py's layout, in variants for the A/B of
issue 44 (benchmarks/gpu_int4_gemv.py); instructions a weight in the compiled step loop (sm_90, bf16, K 4096, by
Triton 3.6 as on the H200; benchmarks/int4_gemv_sass.py counts them without a GPU) in brackets:

- "v3" [14.5 at its 16 x 32 tile]: per weight a shift, an and, an int -> float conversion (I2F: a slow instruction on
  Hopper), the zero point's subtraction, the scale's product and the FMA; zero point and scale loaded per word.
  7-12x its weight-bytes floor on an H200 (benchmarks/RESULTS.md, 2026-11-29): compute-bound.
- "fma" [5.2 at 128 rows]: no conversion. A nibble n masked in place (bits s..s+3 of the word, s = 4 (j % 4): the
  upper four nibbles after one shift a word) and OR-ed into the bits of the float 2^23 is the float 2^23 + n 2^s
  exactly; less 2^23 + z 2^s (z the zero point: a constant a row, group and s) it is (n - z) 2^s exactly, against
  x 2^-s (a power of 2: the same product). Per weight one LOP3, one FADD, one FFMA; the scale once a packed word.
- "dot" [3.9] and "dotw" [2.6 at 128 rows and 4 warps]: tensor cores at one token. The magic number in the
  activations' dtype (bf16 0x4300 | n = 128 + n) makes the nibbles 16-bit operands with no conversion, two from
  one and-or (nibbles j and j + 4 in a 32-bit word's halves, side by side in the joined tile: the columns' order
  within a word is 0 4 1 5 2 6 3 7, and x is read in that order); one tl.dot a step sums (128 + q) x in float32, the
  group's scale applies to it and s (128 + z) sum_k x_k comes off at the end. "dot": x as the first of 16 rows
  times W^T; "dotw": W times x as the first of 16 columns (Hopper's wgmma takes its left operand from registers).
  Only the masking stays on the CUDA cores. 16-bit activations with groups of at least 128 columns (steps of 16
  words); float32 ones (the reference math: (128 + q) x sums lose ~7 bits) and smaller groups take "fma".

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

VARIANTS = ("v3", "fma", "dot", "dotw")
# the bits OR-ed onto masked nibbles: "fma"'s float32 2^23, the dot variants' 128 in the operands' dtype (a pair in
# 16 bits). A kernel argument, not a constant: ptxas rematerialized the immediate into a register before each LOP3
# that takes it with the mask (one MOV for every two weights in the compiled loop)
MAGIC = {"fma": 0x4B000000, torch.bfloat16: 0x43004300, torch.float16: 0x58005800, torch.float32: 0x43000000}


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
def _fma_span(magic, x_ptr, q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, step, following, K: tl.constexpr,
              GROUPS: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, WORDS: tl.constexpr,
              AHEAD: tl.constexpr):
    """The "fma" variant's sums over words start .. end - 1 (module docstring): float32 [BLOCK_N]. `step` is the
    first step's _step_tile, `following` the second's where AHEAD is 2: each step loads the tile AHEAD steps on
    before its arithmetic (in flight meanwhile)."""
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
def _magic_operands(packed, j: tl.constexpr, magic, dtype: tl.constexpr):
    """128 + nibble j and 128 + nibble j + 4 of each word in `dtype` (bfloat16, float16 or float32), made by bits
    alone (`magic`: MAGIC[dtype]): in 16 bits, both from one and-or of the word shifted by 4j (a pair in its halves)."""
    v = packed >> (4 * j)  # nibble j in bits 0..3, nibble j + 4 in bits 16..19
    if dtype == tl.bfloat16:  # 0x4300 is 128, its last mantissa bit 1
        pair = (v & 0x000F000F) | magic
        return pair.to(tl.int16).to(tl.bfloat16, bitcast=True), (pair >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    elif dtype == tl.float16:  # 0x5800 is 128, its last mantissa bit 1/8
        pair = ((v << 3) & 0x00780078) | magic
        return pair.to(tl.int16).to(tl.float16, bitcast=True), (pair >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    else:  # 0x43000000 is 128, its bit 16 is 1
        return (((v << 16) & 0xF0000) | magic).to(tl.float32, bitcast=True), \
            ((v & 0xF0000) | magic).to(tl.float32, bitcast=True)


@triton.jit
def _dot_span(magic, x_ptr, q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, step, following, K: tl.constexpr,
              GROUPS: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, WORDS: tl.constexpr,
              AHEAD: tl.constexpr, PRECISION: tl.constexpr, WEIGHTS_LEFT: tl.constexpr):
    """The "dot" and "dotw" variants' sums over words start .. end - 1 (module docstring), the steps as _fma_span's:
    float32 [BLOCK_N]. One tl.dot a step: the eight nibble tiles joined into one [BLOCK_N, 8 * WORDS] operand."""
    dtype = x_ptr.dtype.element_ty
    pad = tl.arange(0, 16)
    flat = tl.arange(0, 8 * WORDS)
    order = flat // 8 * 8 + flat % 8 // 2 + flat % 2 * 4  # the joined tile's columns (below)
    acc = tl.zeros([BLOCK_N, 16] if WEIGHTS_LEFT else [16, BLOCK_N], tl.float32)
    offset = tl.zeros([BLOCK_N], tl.float32)  # the magic number's part: sum over groups of s (128 + z) sum_k x_k
    for word in range(start, end, WORDS):
        later = _step_tile(q_ptr, z_ptr, s_ptr, rows, row_mask, word + AHEAD * WORDS, end, K, GROUPS, GROUP, WORDS)
        packed, zero, scale = step
        t0, t4 = _magic_operands(packed, 0, magic, dtype)
        t1, t5 = _magic_operands(packed, 1, magic, dtype)
        t2, t6 = _magic_operands(packed, 2, magic, dtype)
        t3, t7 = _magic_operands(packed, 3, magic, dtype)
        # join appends its axis last: the flat index within a word is 2j + h for nibble j + 4h (j < 4), so that
        # nibbles j and j + 4, the halves of one and-or, sit side by side as the operand's 16-bit pairs
        w = tl.join(tl.join(tl.join(t0, t2), tl.join(t1, t3)), tl.join(tl.join(t4, t6), tl.join(t5, t7)))
        w = tl.reshape(w, [BLOCK_N, 8 * WORDS])
        x = tl.load(x_ptr + word * 8 + order)
        x_pad = tl.where((pad == 0)[:, None], x[None, :], 0.0).to(dtype)
        if WEIGHTS_LEFT:  # W times x as the first of 16 columns: Hopper's wgmma takes its left operand in registers
            acc += scale[:, None] * tl.dot(w, tl.trans(x_pad), input_precision=PRECISION, out_dtype=tl.float32)
        else:  # x as the first of 16 rows times W^T
            acc += scale[None, :] * tl.dot(x_pad, tl.trans(w), input_precision=PRECISION, out_dtype=tl.float32)
        offset += scale * (128.0 + zero) * tl.sum(x.to(tl.float32), axis=0)
        if AHEAD == 2:
            step, following = following, later
        else:
            step = later
    # the padding's columns (rows) are 0
    return (tl.sum(acc, axis=1) if WEIGHTS_LEFT else tl.sum(acc, axis=0)) - offset


@triton.jit
def _int4_gemv_kernel(x_ptr, q_ptr, z_ptr, s_ptr, out_ptr, parts_ptr, arrivals_ptr, N, magic, n_parts, span,
                      K: tl.constexpr,
                      GROUPS: tl.constexpr, GROUP: tl.constexpr, VARIANT: tl.constexpr, BLOCK_N: tl.constexpr,
                      WORDS: tl.constexpr, AHEAD: tl.constexpr, SPLIT_K: tl.constexpr, PRECISION: tl.constexpr,
                      PDL: tl.constexpr):
    """out[rows] = sum over columns of (q - zero) * scale * x, by program (tile, part) over its part's `span` words
    (of n_parts; SPLIT_K: more than one. Run-time values: a split does not compile a kernel of its own)."""
    tile = tl.program_id(0)
    part = tl.program_id(1)
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    start = part * span
    end = tl.minimum(start + span, K // 8)
    if VARIANT != "v3":  # the weights do not depend on the kernel before: the first tiles are in flight during the wait
        first = _step_tile(q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, K, GROUPS, GROUP, WORDS)
        following = first
        if AHEAD == 2:
            following = _step_tile(q_ptr, z_ptr, s_ptr, rows, row_mask, start + WORDS, end, K, GROUPS, GROUP, WORDS)
    wait_for_previous_kernel(PDL)  # x is the previous kernel's output (and the counters its to reset)
    if VARIANT == "dot" or VARIANT == "dotw":
        y = _dot_span(magic, x_ptr, q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, first, following, K, GROUPS,
                      GROUP, BLOCK_N, WORDS, AHEAD, PRECISION, VARIANT == "dotw")
    elif VARIANT == "fma":
        y = _fma_span(magic, x_ptr, q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, first, following, K, GROUPS,
                      GROUP, BLOCK_N, WORDS, AHEAD)
    else:
        y = _v3_span(x_ptr, q_ptr, z_ptr, s_ptr, rows, row_mask, start, end, K, GROUPS, GROUP, BLOCK_N, WORDS)
    if not SPLIT_K:
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_mask)
    else:
        tl.store(parts_ptr + part * N + rows, y, mask=row_mask)
        if arrived_last(arrivals_ptr, tile, n_parts):
            total = tl.zeros([BLOCK_N], tl.float32)
            for i in range(n_parts):  # .cg: from the L2, where the other programs' stores are
                total += tl.load(parts_ptr + i * N + rows, mask=row_mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=row_mask)


# the variant and its tile (BLOCK_N, WORDS, num_warps, AHEAD, SPLIT; SPLIT 0: enough programs to fill the GPU,
# AUTO_PROGRAMS a multiprocessor) by the weight's (N, K), else DEFAULT. benchmarks/gpu_int4_gemv.py sweeps them.
DEFAULT: tuple[str, tuple[int, int, int, int, int]] = ("dotw", (128, 16, 4, 2, 0))
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
    """x [1, K] (contiguous) times the INT4 weight: [1, N] in x's dtype. `variant`/`tile`: else SHAPES' or DEFAULT's,
    "fma" for float32 x ("dot" and "dotw" take "fma" where the groups are under 128 columns)."""
    n, groups = scales.shape
    k = x.shape[1]
    group = k // groups
    chosen_variant, chosen_tile = SHAPES.get((n, k), DEFAULT)
    if x.dtype == torch.float32:  # the reference math: the dot variants' float32 sums of (128 + q) x lose ~7 bits
        chosen_variant = "fma"
    variant, (block_n, words, warps, ahead, split) = variant or chosen_variant, tile or chosen_tile
    assert variant in VARIANTS, variant
    if variant != "v3":
        words = min(words, group // 8)  # a step within one group
        if variant.startswith("dot") and words < 16:
            variant = "fma"
    tiles, steps = triton.cdiv(n, block_n), triton.cdiv(k // 8, words)
    split = min(split or _split(x.device, tiles, steps), steps)
    span = triton.cdiv(steps, split) * words
    split = triton.cdiv(k // 8, span)  # no part left empty
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    parts = torch.empty((split, n), dtype=torch.float32, device=x.device) if split > 1 else out
    arrivals = counters(x.device, tiles) if split > 1 else out
    _int4_gemv_kernel[(tiles, split)](
        x, qweight, zeros, scales, out, parts, arrivals, n, MAGIC["fma" if variant == "fma" else x.dtype], split, span,
        K=k, GROUPS=groups, GROUP=group, VARIANT=variant, BLOCK_N=block_n, WORDS=words, AHEAD=ahead, SPLIT_K=split > 1,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", PDL=pdl, num_warps=warps, num_stages=1,
        **launch_options(pdl))
    return out
