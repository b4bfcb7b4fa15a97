"""Triton paged attention for CUDA: KV store, decode and variable-length prefill over the block tables.

Cache layout per layer: [2, num_blocks, block_size, num_kv_heads, head_dim] (runtime/native/models/kv_cache.py),
so a token's K (or V) for all KV heads is one contiguous row at `slot = block_id * block_size + offset`.

- `store_kv`: one program per new token copies its K and V rows to its slot; a slot < 0 is skipped,
  which is how padded rows of a replayed CUDA graph write nothing.
- decode: one program per (sequence, KV head) attends the head's whole query group at once
  (GQA: the K/V tile is read once for all its query heads) with an online softmax over the blocks;
  the loop bound is read from `seq_lens` on the device, so the launch shape does not depend on the
  step's contents and the kernel can be captured in a CUDA graph. A sequence of length 0 (padding)
  yields zeros.
- prefill: one program per (query tile of one sequence, head); it reads every key, cached context
  and the new tokens alike, from the paged cache (the new ones were stored first), causally. A tile
  past the sequence's new tokens (a prefill graph's padding, runtime/native/cuda/prefill_graphs.py) does nothing.
Both kernels accumulate in float32; float32 models use IEEE (not TF32) dot products so greedy decoding
matches an fp32 reference. An FP8 cache (--kv-cache-dtype fp8: E4M3) stores K / k_scale and V / v_scale (float32
division, then the saturating cast; runtime/native/models/kv_scales.py) and is read back into the queries' dtype tile by
tile; the scales are applied outside the key loop: k_scale joins the queries' softmax scale, v_scale multiplies the
output (the same math as scaling each tile, up to rounding, for no work per tile; 16-bit caches pass 1 and 1).

Sliding windows (WINDOWED, `window` keys a query sees) start a row's loop at the key tile holding its first visible
key, so blocks before the window are not read; tiles stay aligned to multiples of BLOCK_N in both kernels (a row's
online softmax takes the same steps in either). Attention sinks (SINKS, gpt-oss: a logit per head) join the softmax
after the last tile.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from runtime.native.attention_metadata import AttentionMetadata
from runtime.native.cuda import pdl
from runtime.native.cuda.pdl import wait_for_previous_kernel
from runtime.native.device import host_tensor
from runtime.native.models.kv_scales import UNIT, KvScales

# 128 keys a tile: 4.6 us per call at batch 1 and 129-256 tokens vs 5.2-6.2 us with 64, 12.7 vs 19.1 at 1,024
# (H200, benchmarks/cuda_decode_attention.py)
DECODE_BLOCK_N = 128
# The same key tiles as decode: a query row then goes through the same online-softmax steps in either kernel, so
# its output does not depend on whether its step also holds multi-token rows (a speculative verification, a
# prompt). With 64 the two differed past 64 keys (H200, fp32 and bf16), and greedy ids with speculation could
# part from plain decoding on near ties.
PREFILL_BLOCK_N = DECODE_BLOCK_N
DECODE_NUM_WARPS = 4


class PrefillTile(NamedTuple):
    """The prefill kernel's query rows a program (BLOCK_M), warps and pipeline stages."""

    block_m: int
    num_warps: int
    num_stages: int


# Tiles by head size for 16-bit queries; others (float32, whose tiles take twice the shared memory) get PREFILL_TILE.
# H200, 2026-11-29, a 1,024-token prompt, 32 heads over 8 KV heads (benchmarks/cuda_prefill_attention.py): head size
# 128: 70 us with (128, 8, 3) against 99 us with (64, 4, 2); head size 64: (64, 4, 2) the best (37 us; 56 us with
# 128 rows). Every setting kept the rows' bits equal to the decode kernel's (the key tiles are the same).
PREFILL_TILE = PrefillTile(64, 4, 2)
PREFILL_TILES_16BIT: dict[int, PrefillTile] = {128: PrefillTile(128, 8, 3)}


def prefill_tile(head_dim: int, dtype: torch.dtype) -> PrefillTile:
    """The prefill kernel's tile for queries of `head_dim` in `dtype` (the activations')."""
    return PREFILL_TILES_16BIT.get(head_dim, PREFILL_TILE) if dtype.itemsize == 2 else PREFILL_TILE


# A step's metadata (block tables, lengths, slots, the tile map) sits at whatever offset its staging buffer gives it,
# and a table's width follows the step's longest sequence. Triton specializes a kernel on pointer alignment and on
# integers equal to 1 or divisible by 16, so these made it compile the kernels again while serving, for each new
# combination: 0.4-0.7 s each, several times a run of a draft model's catch-ups (H200, benchmarks/RESULTS.md).


@triton.jit
def to_cache(x, scale, cache_ptr):
    """Keys or values as the cache at `cache_ptr` stores them: x / scale, correctly rounded in float32 (as the
    reference's division; exact for scale 1), then the cast (saturating for E4M3)."""
    return tl.div_rn(x.to(tl.float32), scale).to(cache_ptr.dtype.element_ty)


@triton.jit(do_not_specialize_on_alignment=["slot_ptr"])
def _store_kv_kernel(
    k_ptr, v_ptr, cache_ptr, slot_ptr, v_offset, stride_k, stride_v, k_scale, v_scale,
    ROW: tl.constexpr, BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        offs = tl.arange(0, BLOCK)
        mask = offs < ROW
        k = tl.load(k_ptr + t * stride_k + offs, mask=mask)
        v = tl.load(v_ptr + t * stride_v + offs, mask=mask)
        tl.store(cache_ptr + slot * ROW + offs, to_cache(k, k_scale, cache_ptr), mask=mask)
        tl.store(cache_ptr + v_offset + slot * ROW + offs, to_cache(v, v_scale, cache_ptr), mask=mask)



@triton.jit
def first_key_tile(lowest_pos, window, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr):
    """Where a loop over keys starts for queries at `lowest_pos` and later: 0, or with a window the tile (aligned to
    BLOCK_N) holding the first key the lowest query sees."""
    # one return of one type: Triton 3.6 refuses a constexpr branch that returns early with another type
    if WINDOWED:
        start = tl.maximum(lowest_pos - window + 1, 0) // BLOCK_N * BLOCK_N
    else:
        start = lowest_pos * 0
    return start


@triton.jit
def _key_tile(
    q, q_pos, m_i, l_i, acc, start, offs_n, offs_d, d_mask, cache_ptr, table_ptr, kvh, v_offset, end, window,
    BLOCK_SIZE: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PRECISION: tl.constexpr, MASKED: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
):
    """One online-softmax step of attend_query_tile over the key tile at `start`: the new (m_i, l_i, acc). Without
    MASKED every key of the tile is below `end` and seen by every row (the masks would change nothing)."""
    pos = start + offs_n
    n_mask = pos < end
    if MASKED:
        block = tl.load(table_ptr + pos // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    else:
        block = tl.load(table_ptr + pos // BLOCK_SIZE).to(tl.int64)
    row = (block * BLOCK_SIZE + pos % BLOCK_SIZE) * HKV + kvh
    kv_mask = (n_mask if MASKED else pos >= 0)[:, None] & d_mask[None, :]
    k = tl.load(cache_ptr + row[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if MASKED:
        seen = n_mask[None, :]
        if CAUSAL:
            seen = seen & (pos[None, :] <= q_pos[:, None])
        if WINDOWED:
            seen = seen & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key in this tile yet (a window's)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(cache_ptr + v_offset + row[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def attend_query_tile(
    q, q_pos, cache_ptr, table_ptr, kvh, v_offset, begin, seen_by_all, end, window, sinks,
    ROWS: tl.constexpr, BLOCK_SIZE: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
    SINKS: tl.constexpr,
):
    """Online-softmax attention of the query tile `q` [ROWS, BLOCK_D] (pre-scaled) over positions
    begin .. end-1 of one sequence's paged cache (`table_ptr`: its block table), KV head `kvh`; CAUSAL rows
    see only positions <= their q_pos, WINDOWED rows only positions > q_pos - window; SINKS: `sinks` [ROWS] join
    each row's softmax. CAUSAL: key tiles wholly below `seen_by_all` (every row sees all of their keys) skip the
    masks, the same steps, bit for bit, as masks that keep everything (a 1,024-token prompt's attention 30-36% faster
    on an H200). Returns the normalised float32 output [ROWS, BLOCK_D]."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    d_mask = offs_d < D
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    masked_from = begin
    if CAUSAL:  # (a decode row's loop stays one loop: a second one made the batch-1 step slower)
        masked_from = tl.maximum(begin, tl.minimum(seen_by_all, end) // BLOCK_N * BLOCK_N)
        for start in range(begin, masked_from, BLOCK_N):
            m_i, l_i, acc = _key_tile(q, q_pos, m_i, l_i, acc, start, offs_n, offs_d, d_mask, cache_ptr, table_ptr,
                                      kvh, v_offset, end, window, BLOCK_SIZE, HKV, D, PRECISION, False, CAUSAL,
                                      WINDOWED)
    for start in range(masked_from, end, BLOCK_N):
        m_i, l_i, acc = _key_tile(q, q_pos, m_i, l_i, acc, start, offs_n, offs_d, d_mask, cache_ptr, table_ptr, kvh,
                                  v_offset, end, window, BLOCK_SIZE, HKV, D, PRECISION, True, CAUSAL, WINDOWED)
    if SINKS:
        m_new = tl.maximum(m_i, sinks)
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.exp(sinks - m_new)
        acc = acc * alpha[:, None]
    return acc / tl.where(l_i > 0, l_i, 1.0)[:, None]


@triton.jit
def attend_decode_group(
    q, heads, group_mask, seq_len, cache_ptr, table_ptr, kvh, v_offset, window, sinks_ptr,
    BLOCK_G: tl.constexpr, BLOCK_SIZE: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, WINDOWED: tl.constexpr, SINKS: tl.constexpr,
):
    """One decode row's query group `q` [BLOCK_G, BLOCK_D] (pre-scaled; query heads `heads`) over its sequence's
    `seq_len` cached keys, the last `window` of them when WINDOWED, with the heads' sinks when SINKS."""
    q_pos = tl.zeros([BLOCK_G], tl.int32) + seq_len - 1
    sinks = tl.zeros([BLOCK_G], tl.float32)  # read only with SINKS
    if SINKS:
        sinks = tl.load(sinks_ptr + heads, mask=group_mask, other=0.0).to(tl.float32)
    begin = first_key_tile(seq_len - 1, window, BLOCK_N, WINDOWED)
    return attend_query_tile(q, q_pos, cache_ptr, table_ptr, kvh, v_offset, begin, begin, seq_len, window, sinks,
                             BLOCK_G, BLOCK_SIZE, HKV, D, BLOCK_D, BLOCK_N, PRECISION, CAUSAL=False,
                             WINDOWED=WINDOWED, SINKS=SINKS)


@triton.jit(do_not_specialize=["stride_tb"], do_not_specialize_on_alignment=["tables_ptr", "seq_lens_ptr"])
def _decode_kernel(
    q_ptr, cache_ptr, out_ptr, tables_ptr, seq_lens_ptr, scale, v_scale, v_offset,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_tb, window, sinks_ptr,
    BLOCK_SIZE: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
    WINDOWED: tl.constexpr, SINKS: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_g < GROUP)[:, None] & (offs_d < D)[None, :]
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + b * stride_qt + heads[:, None] * stride_qh + offs_d[None, :], mask=mask, other=0.0)
    q = (q.to(tl.float32) * scale).to(q_ptr.dtype.element_ty)
    out = attend_decode_group(q, heads, offs_g < GROUP, seq_len, cache_ptr, tables_ptr + b * stride_tb, kvh, v_offset,
                              window, sinks_ptr, BLOCK_G, BLOCK_SIZE, HKV, D, BLOCK_D, BLOCK_N, PRECISION, WINDOWED,
                              SINKS)
    tl.store(out_ptr + b * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             (out * v_scale).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["stride_tb"],
            do_not_specialize_on_alignment=["tables_ptr", "query_start_ptr", "context_lens_ptr", "seq_lens_ptr",
                                            "tile_seq_ptr", "tile_offset_ptr"])
def _prefill_kernel(
    q_ptr, cache_ptr, out_ptr, tables_ptr, query_start_ptr, context_lens_ptr, seq_lens_ptr,
    tile_seq_ptr, tile_offset_ptr, scale, v_scale, v_offset,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_tb, window, sinks_ptr,
    BLOCK_SIZE: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, WINDOWED: tl.constexpr, SINKS: tl.constexpr,
):
    """Program (h, tile): the tile's BLOCK_M queries of query head h. Programs start with the grid's first axis
    fastest: every head of a tile, then the next tile (prefill_tiles puts a sequence's tiles with the most keys first,
    so that short ones fill the last wave)."""
    h = tl.program_id(0)
    tile = tl.program_id(1)
    b = tl.load(tile_seq_ptr + tile)
    q_offset = tl.load(tile_offset_ptr + tile)
    q_start = tl.load(query_start_ptr + b).to(tl.int64)
    context = tl.load(context_lens_ptr + b).to(tl.int32)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    offs_m = q_offset + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m < seq_len - context)[:, None] & (offs_d < D)[None, :]
    q = tl.load(q_ptr + (q_start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=mask, other=0.0)
    q = (q.to(tl.float32) * scale).to(q_ptr.dtype.element_ty)
    q_pos = context + offs_m  # absolute positions: query i sees keys 0 .. q_pos[i]
    end = tl.minimum(seq_len, context + q_offset + BLOCK_M)
    end = tl.where(q_offset < seq_len - context, end, 0)  # a tile past the new tokens (graph padding) reads nothing
    sinks = tl.zeros([BLOCK_M], tl.float32)  # read only with SINKS
    if SINKS:
        sinks += tl.load(sinks_ptr + h).to(tl.float32)
    begin = first_key_tile(context + q_offset, window, BLOCK_N, WINDOWED)
    # every row sees the keys up to the tile's first query (with a window, not the first ones: all tiles masked)
    seen_by_all = begin if WINDOWED else context + q_offset + 1
    out = attend_query_tile(q, q_pos, cache_ptr, tables_ptr + b * stride_tb, h // GROUP, v_offset, begin,
                            seen_by_all, end, window, sinks, BLOCK_M, BLOCK_SIZE, HKV, D, BLOCK_D, BLOCK_N, PRECISION,
                            CAUSAL=True, WINDOWED=WINDOWED, SINKS=SINKS)
    tl.store(out_ptr + (q_start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             (out * v_scale).to(out_ptr.dtype.element_ty), mask=mask)


def precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def store_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
             kv_scales: KvScales = UNIT) -> None:
    """Write each token's K/V [T, Hkv, D] to its slot, divided by the layer's scales; slots < 0 are skipped."""
    tokens = k.shape[0]
    if tokens == 0:
        return
    _, num_blocks, block_size, kv_heads, head_dim = kv_cache.shape
    row = kv_heads * head_dim
    _store_kv_kernel[(tokens,)](
        k, v, kv_cache, slot_mapping, num_blocks * block_size * row, k.stride(0), v.stride(0), kv_scales.k, kv_scales.v,
        ROW=row, BLOCK=triton.next_power_of_2(row),
    )


def decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                     window: int | None = None, sinks: torch.Tensor | None = None,
                     kv_scales: KvScales = UNIT) -> torch.Tensor:
    """One query token per sequence: q [B, H, D] -> [B, H, D]."""
    batch, heads, head_dim = q.shape
    _, num_blocks, block_size, kv_heads, _ = kv_cache.shape
    group = heads // kv_heads
    out = torch.empty_like(q)
    tables = meta.block_tables
    _decode_kernel[(batch, kv_heads)](
        q, kv_cache, out, tables, meta.seq_lens, scale * kv_scales.k, kv_scales.v,
        num_blocks * block_size * kv_heads * head_dim,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), tables.stride(0), window or 0,
        q if sinks is None else sinks,
        BLOCK_SIZE=block_size, HKV=kv_heads, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        D=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_N=DECODE_BLOCK_N,
        PRECISION=precision(q.dtype), num_warps=DECODE_NUM_WARPS, PDL=pdl.ENABLED,
        WINDOWED=window is not None, SINKS=sinks is not None, **pdl.launch_options(),
    )
    return out


def prefill_tiles(query_lens: list[int], block_m: int) -> tuple[list[int], list[int]]:
    """(sequence index, first query offset) of every BLOCK_M-query tile of the step's sequences, each sequence's
    last (the most keys) first."""
    seqs: list[int] = []
    offsets: list[int] = []
    for b, n in enumerate(query_lens):
        for off in reversed(range(0, n, block_m)):
            seqs.append(b)
            offsets.append(off)
    return seqs, offsets


def prefill_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                      window: int | None = None, sinks: torch.Tensor | None = None,
                      kv_scales: KvScales = UNIT) -> torch.Tensor:
    """Packed queries of any lengths, q [T, H, D] -> [T, H, D], over keys already in the cache."""
    tokens, heads, head_dim = q.shape
    _, num_blocks, block_size, kv_heads, _ = kv_cache.shape
    # the tile map (with the tile it was made for) is the same for every layer of the step: built once per metadata
    # object, or given by a prefill graph's buffer
    entry = meta.derived.get("triton_prefill_tiles")
    if entry is None:
        tile = prefill_tile(head_dim, q.dtype)
        seqs, offsets = prefill_tiles(meta.query_lens_host, tile.block_m)
        entry = meta.derived["triton_prefill_tiles"] = (host_tensor([seqs, offsets], torch.int32, q.device), tile)
    tiles, tile = entry
    out = torch.empty_like(q)
    tables = meta.block_tables
    _prefill_kernel[(heads, tiles.shape[1])](
        q, kv_cache, out, tables, meta.query_start_loc, meta.context_lens, meta.seq_lens, tiles[0], tiles[1],
        scale * kv_scales.k, kv_scales.v, num_blocks * block_size * kv_heads * head_dim,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), tables.stride(0), window or 0,
        q if sinks is None else sinks,
        BLOCK_SIZE=block_size, HKV=kv_heads, GROUP=heads // kv_heads,
        D=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=tile.block_m, BLOCK_N=PREFILL_BLOCK_N, PRECISION=precision(q.dtype),
        WINDOWED=window is not None, SINKS=sinks is not None, num_warps=tile.num_warps, num_stages=tile.num_stages,
    )
    return out


def triton_paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor | None,
    meta: AttentionMetadata,
    scale: float,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    kv_scales: KvScales = UNIT,
) -> torch.Tensor:
    """The "cuda" attention backend (runtime/native/models/attention.py's AttentionBackend)."""
    if kv_cache is None:  # cache-less warm-up / profiling pass: the reference path handles it
        from runtime.native.models.attention import torch_paged_attention

        return torch_paged_attention(q, k, v, kv_cache, meta, scale, window, sinks)
    store_kv(k, v, kv_cache, meta.slot_mapping, kv_scales)
    return attend_over_cache(q, kv_cache, meta, scale, window, sinks, kv_scales)


def attend_over_cache(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                      window: int | None = None, sinks: torch.Tensor | None = None,
                      kv_scales: KvScales = UNIT) -> torch.Tensor:
    """Attention of q [T, H, D] over the cache, once the step's new K/V are stored there (a sliding `window`,
    float32 `sinks` [H], an FP8 cache's `kv_scales`: see the module docstring)."""
    if meta.decode is not None:  # a mixed step: its decode-shaped rows first (runtime/native/cuda/mixed_graphs.py)
        rows = meta.decode_rows
        return torch.cat((decode_attention(q[:rows], kv_cache, meta.decode, scale, window, sinks, kv_scales),
                          prefill_attention(q[rows:], kv_cache, meta, scale, window, sinks, kv_scales)))
    if meta.is_decode_only:
        return decode_attention(q, kv_cache, meta, scale, window, sinks, kv_scales)
    return prefill_attention(q, kv_cache, meta, scale, window, sinks, kv_scales)
