"""The one-token product (GEMV) with INT4 weights in runtime/native/cuda/int4.py's layout, with no int -> float
conversion (I2F: a slow instruction on Hopper). A nibble n masked in place (bits s..s+3 of the word, s = 4 (j % 4):
the upper four nibbles after one shift a word) and OR-ed into the bits of the float 2^23 is the float 2^23 + n 2^s
exactly; less 2^23 + z 2^s (z the zero point: a constant a row, group and s) it is (n - z) 2^s exactly, against
x 2^-s (a power of 2: the same product). Per weight one LOP3, one FADD, one FFMA (6 instructions a weight in the
compiled step loop at 64 x 16 words, sm_90 bf16, Triton 3.6); the scale once a packed word. Issue 44's A/B on an
H200 (benchmarks/RESULTS.md, 2026-11-29) kept it against a conversion per weight (3.5x its time) and tensor-core
variants (tl.dot of magic-number operands: fewer instructions a weight, slower).

PAIRS (16-bit x on a GPU; FasterTransformer's weight-only GEMV in PTX): two weights an instruction. (word >> s) &
0x000F000F | 0x43004300 is the bf16 pair 128 + n of nibbles s/4 and s/4 + 4 (f16: 0x64006400, 1024 + n), exactly;
one HSUB2 of 128 + z makes it n - z (exact), one HFMA2 multiplies it by x's pair (two x words PRMT-ed into one) and
adds it to the pair sum: per 8 weights 3 SHF, 4 LOP3, 4 HSUB2, 4 HFMA2; every PAIRS words (1 or 2) the pair sum's
halves to float32 (a shift and an AND for bf16), one FADD, one FFMA by the scale. Instructions a weight in the loop
(benchmarks/int4_gemv_sass.py: sm_90, bf16, Triton 3.6 as on the H200) at 128 x 16 x 4 warps: fma 5.16, PAIRS 1
3.49, PAIRS 2 3.24; PAIRS 2 at 256 x 16 x 8 warps 3.16, x 4 warps 3.00 (168 registers). The cost: each product
and the pair sums (4 or 8 products a half) round to x's 16 bits (bf16: 2^-9 relative); against the float reference,
bf16 outputs' relative error RMS (emulated on CPU, random 4096 x 4096 weights) 0.0016 from the output's own rounding
(fma), 0.0028 with PAIRS 1, 0.0041 with PAIRS 2. Off the GPU (Triton's interpreter: no PTX) and for float32 x, fma.

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
from triton.runtime.interpreter import InterpretedFunction

from runtime.native.cuda.arrivals import arrived_last, counters
from runtime.native.cuda.pdl import launch_options, wait_for_previous_kernel

# the float32 2^23 OR-ed onto masked nibbles. A kernel argument, not a constant: ptxas rematerialized the immediate
# into a register before each LOP3 that takes it with the mask (one MOV for every two weights in the compiled loop)
MAGIC = 0x4B000000


# rows of the layout's tiles (int4.py): a GEMV program's BLOCK_N rows (a divisor of it) read one group's words as
# one contiguous run (8 KB at 128 rows x 16 words), and their zero points and scales as two
TILE_ROWS = 256
_TILE_ROWS = tl.constexpr(TILE_ROWS)


@triton.jit
def stored_group(first, group, GROUPS: tl.constexpr):
    """The index of (row `first`, group `group`) in the zero points and scales of int4.py's layout (row first + i:
    this + i, within the rows' tile)."""
    return ((first // _TILE_ROWS * GROUPS + group) * _TILE_ROWS + first % _TILE_ROWS).to(tl.int64)


@triton.jit
def stored_words(first, word, GROUPS: tl.constexpr, GROUP: tl.constexpr, WORDS: tl.constexpr):
    """The index of packed word `word` of row `first` in int4.py's layout (row first + i: this + i GROUP / 8), for
    steps of WORDS words from a multiple of WORDS: written as a multiple of WORDS, which lets the compiler load
    the step's words in 16-byte vectors."""
    within = word // WORDS % (GROUP // 8 // WORDS) * WORDS
    return stored_group(first, word // (GROUP // 8), GROUPS) * (GROUP // 8) + within


@triton.jit
def _step_tile(q_ptr, z_ptr, s_ptr, first, local, row_mask, word, end, GROUPS: tl.constexpr, GROUP: tl.constexpr,
               WORDS: tl.constexpr):
    """Packed words word .. word + WORDS - 1 of rows first + local (int32 [BLOCK_N, WORDS], all in one group) and
    that group's zero point (int32 [BLOCK_N]) and scale (float32) of each row; zeros from `end` on (a step past the
    part's end)."""
    mask = row_mask & (local * 0 + word < end)
    words = stored_words(first, word, GROUPS, GROUP, WORDS) + local[:, None] * (GROUP // 8) + tl.arange(0, WORDS)
    packed = tl.load(q_ptr + words, mask=mask[:, None], other=0)
    group = stored_group(first, word // (GROUP // 8), GROUPS) + local
    zero = tl.load(z_ptr + group, mask=mask, other=0).to(tl.int32)
    scale = tl.load(s_ptr + group, mask=mask, other=0.0).to(tl.float32)
    return packed, zero, scale


def _pairs_asm(kind: str, magic: int, to_float32: str, words: int) -> tl.constexpr:
    """PTX for `words` packed words of one row (module docstring, PAIRS): $1.. the words, then the row's magic + zero
    point in both halves, then 4 x pairs a word (nibble positions (0, 4), (1, 5), (2, 6), (3, 7)); $0 the float32 bits
    of the words' sum. The pairs' products are summed in 16 bits (4 a half a word) before `to_float32` makes the
    halves float32 (lo, hi) from the pair sum `acc`."""
    zeros, steps = words + 1, []
    for w in range(words):
        for i in range(4):
            shifted = f"${1 + w}" if i == 0 else "t"
            shift = "" if i == 0 else f"shr.u32 t, ${1 + w}, {4 * i}; "
            x = f"${zeros + 1 + 4 * w + i}"
            product = f"mul.{kind} acc, w, {x};" if w == i == 0 else f"fma.rn.{kind} acc, w, {x}, acc;"
            steps.append(f"{shift}lop3.b32 w, {shifted}, 0x000F000F, {magic:#x}, 0xEA; sub.{kind} w, w, ${zeros}; "
                         + product)
    return tl.constexpr("{ .reg .b32 w, t, acc, lo, hi; " + " ".join(steps) + to_float32 + " add.f32 $0, lo, hi; }")


# (q & 0x000F000F) | magic: 128 + n (bf16) or 1024 + n (f16) in each half, exactly; bf16 to float32 is a shift
_BF16_TO_FLOAT32 = "shl.b32 lo, acc, 16; and.b32 hi, acc, 0xFFFF0000;"
_F16_TO_FLOAT32 = "{ .reg .b16 l, h; mov.b32 {l, h}, acc; cvt.f32.f16 lo, l; cvt.f32.f16 hi, h; }"
_PAIRS_BF16 = _pairs_asm("bf16x2", 0x43004300, _BF16_TO_FLOAT32, 1)
_PAIRS_F16 = _pairs_asm("f16x2", 0x64006400, _F16_TO_FLOAT32, 1)
_PAIRS2_BF16 = _pairs_asm("bf16x2", 0x43004300, _BF16_TO_FLOAT32, 2)
_PAIRS2_F16 = _pairs_asm("f16x2", 0x64006400, _F16_TO_FLOAT32, 2)


# PRMT's selectors of the low and of the high 16-bit halves of two words into one
_LOW_HALVES = tl.constexpr("prmt.b32 $0, $1, $2, 0x5410;")
_HIGH_HALVES = tl.constexpr("prmt.b32 $0, $1, $2, 0x7632;")


@triton.jit
def _halves(pairs, PAIRS: tl.constexpr):
    """[R, WORDS] as itself (PAIRS 1) or its even and odd words (PAIRS 2: [R, WORDS / 2] each; the same thread's
    registers where it holds consecutive words)."""
    if PAIRS == 2:
        even, odd = tl.split(tl.reshape(pairs, [pairs.shape[0], pairs.shape[1] // 2, 2]))
    else:
        even, odd = pairs, pairs
    return even, odd


@triton.jit
def _x_pairs(low, high, SELECT: tl.constexpr, PAIRS: tl.constexpr):
    """x's pairs (SELECT: the low or the high halves of the x words `low` and `high`) of each packed word, as
    _halves splits them: [1, WORDS] or [1, WORDS / 2] twice."""
    return _halves(tl.inline_asm_elementwise(SELECT, "=r,r,r", [low, high], tl.int32, True, 1)[None, :], PAIRS)


@triton.jit
def _pairs_dot(x_ptr, packed, zero, word, WORDS: tl.constexpr, PAIRS: tl.constexpr):
    """The sums (q - zero) x of each row and packed word (PAIRS 1: float32 [BLOCK_N, WORDS]), or of each two words
    (PAIRS 2: [BLOCK_N, WORDS / 2]), two weights an instruction in x's 16-bit type (module docstring, PAIRS)."""
    x_words = x_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + (word + tl.arange(0, WORDS)) * 4
    x01, x23, x45, x67 = tl.load(x_words), tl.load(x_words + 1), tl.load(x_words + 2), tl.load(x_words + 3)
    x04, x04_odd = _x_pairs(x01, x45, _LOW_HALVES, PAIRS)
    x15, x15_odd = _x_pairs(x01, x45, _HIGH_HALVES, PAIRS)
    x26, x26_odd = _x_pairs(x23, x67, _LOW_HALVES, PAIRS)
    x37, x37_odd = _x_pairs(x23, x67, _HIGH_HALVES, PAIRS)
    words, words_odd = _halves(packed, PAIRS)
    f16: tl.constexpr = x_ptr.dtype.element_ty == tl.float16
    zeros = (zero[:, None] + (0x6400 if f16 else 0x4300)) * 0x10001  # 1024 + z (f16) or 128 + z in both halves
    if PAIRS == 2:
        sums = tl.inline_asm_elementwise(_PAIRS2_F16 if f16 else _PAIRS2_BF16, "=r" + ",r" * 11,
                                         [words, words_odd, zeros, x04, x15, x26, x37, x04_odd, x15_odd, x26_odd,
                                          x37_odd], tl.int32, True, 1)
    else:
        sums = tl.inline_asm_elementwise(_PAIRS_F16 if f16 else _PAIRS_BF16, "=r" + ",r" * 6,
                                         [words, zeros, x04, x15, x26, x37], tl.int32, True, 1)
    return sums.to(tl.float32, bitcast=True)


@triton.jit
def _fma_dot(magic, x_ptr, packed, zero, word, BLOCK_N: tl.constexpr, WORDS: tl.constexpr):
    """The sums (q - zero) x of each row and packed word (float32 [BLOCK_N, WORDS]) in float32: one LOP3, FADD and
    FFMA a weight (module docstring)."""
    cols = (word + tl.arange(0, WORDS)) * 8
    upper = packed >> 16  # nibbles 4..7 in bits 0..15 (the sign's copies above are masked off)
    zero = zero.to(tl.float32)
    dot = tl.zeros([BLOCK_N, WORDS], tl.float32)
    for j in tl.static_range(8):
        half = packed if j < 4 else upper
        # magic 0x4B000000 is 2^23, whose mantissa bits are the integer added to it: 2^23 + n 2^s, s = 4 (j % 4);
        # less 2^23 + z 2^s (one constant a row and s), (n - z) 2^s exactly, against x 2^-s
        nibble = ((half & (0xF << (4 * (j % 4)))) | magic).to(tl.float32, bitcast=True)
        x = tl.load(x_ptr + cols + j).to(tl.float32) * (1.0 / (1 << (4 * (j % 4))))
        dot += (nibble - (8388608.0 + zero * (1 << (4 * (j % 4))))[:, None]) * x[None, :]
    return dot


@triton.jit
def _span(magic, x_ptr, q_ptr, z_ptr, s_ptr, first, local, row_mask, start, end, step, following,
          GROUPS: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, WORDS: tl.constexpr, AHEAD: tl.constexpr,
          PAIRS: tl.constexpr):
    """The sums over words start .. end - 1 (module docstring): float32 [BLOCK_N]. `step` is the first step's
    _step_tile, `following` the second's where AHEAD is 2: each step loads the tile AHEAD steps on before its
    arithmetic (in flight meanwhile)."""
    acc = tl.zeros([BLOCK_N, WORDS // 2 if PAIRS == 2 else WORDS], tl.float32)
    for word in range(start, end, WORDS):
        later = _step_tile(q_ptr, z_ptr, s_ptr, first, local, row_mask, word + AHEAD * WORDS, end, GROUPS, GROUP,
                           WORDS)
        packed, zero, scale = step
        if PAIRS:
            dot = _pairs_dot(x_ptr, packed, zero, word, WORDS, PAIRS)
        else:
            dot = _fma_dot(magic, x_ptr, packed, zero, word, BLOCK_N, WORDS)
        acc += scale[:, None] * dot
        if AHEAD == 2:
            step, following = following, later
        else:
            step = later
    return tl.sum(acc, axis=1)


@triton.jit
def _int4_gemv_kernel(x_ptr, q_ptr, z_ptr, s_ptr, out_ptr, parts_ptr, arrivals_ptr, N, magic, n_parts, span,
                      K: tl.constexpr, GROUPS: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                      WORDS: tl.constexpr, AHEAD: tl.constexpr, SPLIT_K: tl.constexpr, PAIRS: tl.constexpr,
                      PDL: tl.constexpr):
    """out[rows] = sum over columns of (q - zero) * scale * x, by program (tile, part) over its part's `span` words
    (of n_parts; SPLIT_K: more than one. Run-time values: a split does not compile a kernel of its own)."""
    tile = tl.program_id(0)
    part = tl.program_id(1)
    first = tile * BLOCK_N
    local = tl.arange(0, BLOCK_N)
    rows = first + local
    row_mask = rows < N
    start = part * span
    end = tl.minimum(start + span, K // 8)
    # the weights do not depend on the kernel before: the first tiles are in flight during the wait
    step = _step_tile(q_ptr, z_ptr, s_ptr, first, local, row_mask, start, end, GROUPS, GROUP, WORDS)
    following = step
    if AHEAD == 2:
        following = _step_tile(q_ptr, z_ptr, s_ptr, first, local, row_mask, start + WORDS, end, GROUPS, GROUP, WORDS)
    wait_for_previous_kernel(PDL)  # x is the previous kernel's output (and the counters its to reset)
    y = _span(magic, x_ptr, q_ptr, z_ptr, s_ptr, first, local, row_mask, start, end, step, following, GROUPS, GROUP,
              BLOCK_N, WORDS, AHEAD, PAIRS)
    if not SPLIT_K:
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_mask)
    else:
        tl.store(parts_ptr + part * N + rows, y, mask=row_mask)
        if arrived_last(arrivals_ptr, tile, n_parts):
            total = tl.zeros([BLOCK_N], tl.float32)
            for i in range(n_parts):  # .cg: from the L2, where the other programs' stores are
                total += tl.load(parts_ptr + i * N + rows, mask=row_mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=row_mask)


# the tile (BLOCK_N, WORDS, num_warps, AHEAD, SPLIT, PAIRS; SPLIT 0: AUTO_PROGRAMS programs a multiprocessor, split-K
# where the tiles alone are fewer; PAIRS 1 or 2: two weights an instruction, 16-bit x only) by the weight's (N, K), else
# DEFAULT: the fastest of benchmarks/gpu_int4_gemv.py's sweep per Llama-3.1-8B projection on an H200 (RESULTS.md,
# 2026-11-29 12:40 UTC: PAIRS 2 won on all four). Gate/up's fastest alone, (256, 16, 8, 1, 0, 2), made the graphed
# batch-1 step 3% slower than DEFAULT (2.851 against 2.765 ms, 2026-11-30): every shape takes DEFAULT
Tile = tuple[int, int, int, int, int, int]
DEFAULT: Tile = (128, 16, 4, 2, 0, 2)
SHAPES: dict[tuple[int, int], Tile] = {}
# 3 (a DEFAULT tile's registers let 3 programs share a multiprocessor: one wave) made the graphed 8B batch-1 step
# 2.887 -> 2.642 ms against 4 (2 2.672, 5 2.967, 6 2.851, 8 2.934; H200, 2026-11-30, benchmarks/RESULTS.md)
AUTO_PROGRAMS = 3
_multiprocessors: dict[torch.device, int] = {}


def _split(device: torch.device, tiles: int, steps: int) -> int:
    """Parts of K per tile for AUTO_PROGRAMS programs a multiprocessor (4 multiprocessors off CUDA)."""
    if device not in _multiprocessors:
        _multiprocessors[device] = (torch.cuda.get_device_properties(device).multi_processor_count
                                    if device.type == "cuda" else 4)
    return max(1, min(steps, -(-AUTO_PROGRAMS * _multiprocessors[device] // tiles)))


def int4_gemv(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, n: int,
              tile: Tile | None = None, pdl: bool = False) -> torch.Tensor:
    """x [1, K] (contiguous) times the INT4 weight of N rows (int4.py's layout): [1, N] in x's dtype. `tile`: else
    SHAPES' or DEFAULT (BLOCK_N a divisor of TILE_ROWS). PAIRS applies to 16-bit x (4-byte aligned) compiled for a
    GPU; float32 x and Triton's interpreter (no inline PTX) take the float32 path."""
    groups = zeros.shape[1]
    k = x.shape[1]
    group = k // groups
    block_n, words, warps, ahead, split, pairs = tile or SHAPES.get((n, k), DEFAULT)
    assert TILE_ROWS % block_n == 0
    # x read as 32-bit words (pairs): 4-byte aligned
    if x.dtype not in (torch.bfloat16, torch.float16) or x.data_ptr() % 4 or isinstance(_int4_gemv_kernel,
                                                                                        InterpretedFunction):
        pairs = 0
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
        BLOCK_N=block_n, WORDS=words, AHEAD=ahead, SPLIT_K=split > 1, PAIRS=pairs, PDL=pdl, num_warps=warps,
        num_stages=1, **launch_options(pdl))
    return out
