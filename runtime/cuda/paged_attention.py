"""Triton paged attention for CUDA: KV store, decode and variable-length prefill over the block tables.

Cache layout per layer: [2, num_blocks, block_size, num_kv_heads, head_dim] (runtime/models/kv_cache.py),
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
  past the sequence's new tokens (a prefill graph's padding, runtime/cuda/prefill_graphs.py) does nothing.
Both kernels accumulate in float32; float32 models use IEEE (not TF32) dot products so greedy decoding
matches an fp32 reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.attention_metadata import AttentionMetadata
from runtime.cuda import pdl
from runtime.cuda.pdl import wait_for_previous_kernel
from runtime.device import host_tensor

# 128 keys a tile: 4.6 us per call at batch 1 and 129-256 tokens vs 5.2-6.2 us with 64, 12.7 vs 19.1 at 1,024
# (H200, benchmarks/cuda_decode_attention.py)
DECODE_BLOCK_N = 128
PREFILL_BLOCK_M = 64
# The same key tiles as decode: a query row then goes through the same online-softmax steps in either kernel, so
# its output does not depend on whether its step also holds multi-token rows (a speculative verification, a
# prompt). With 64 the two differed past 64 keys (H200, fp32 and bf16), and greedy ids with speculation could
# part from plain decoding on near ties.
PREFILL_BLOCK_N = DECODE_BLOCK_N
DECODE_NUM_WARPS = 4


# A step's metadata (block tables, lengths, slots, the tile map) sits at whatever offset its staging buffer gives it,
# and a table's width follows the step's longest sequence. Triton specializes a kernel on pointer alignment and on
# integers equal to 1 or divisible by 16, so these made it compile the kernels again while serving, for each new
# combination: 0.4-0.7 s each, several times a run of a draft model's catch-ups (H200, benchmarks/RESULTS.md).


@triton.jit(do_not_specialize_on_alignment=["slot_ptr"])
def _store_kv_kernel(
    k_ptr, v_ptr, cache_ptr, slot_ptr, v_offset, stride_k, stride_v,
    ROW: tl.constexpr, BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        offs = tl.arange(0, BLOCK)
        mask = offs < ROW
        k = tl.load(k_ptr + t * stride_k + offs, mask=mask)
        v = tl.load(v_ptr + t * stride_v + offs, mask=mask)
        tl.store(cache_ptr + slot * ROW + offs, k.to(cache_ptr.dtype.element_ty), mask=mask)
        tl.store(cache_ptr + v_offset + slot * ROW + offs, v.to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def attend_query_tile(
    q, q_pos, cache_ptr, table_ptr, kvh, v_offset, end,
    ROWS: tl.constexpr, BLOCK_SIZE: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Online-softmax attention of the query tile `q` [ROWS, BLOCK_D] (pre-scaled) over positions
    0 .. end-1 of one sequence's paged cache (`table_ptr`: its block table), KV head `kvh`; CAUSAL rows
    see only positions <= their q_pos. Returns the normalised float32 output [ROWS, BLOCK_D]."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    d_mask = offs_d < D
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for start in range(0, end, BLOCK_N):
        pos = start + offs_n
        n_mask = pos < end
        block = tl.load(table_ptr + pos // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        row = (block * BLOCK_SIZE + pos % BLOCK_SIZE) * HKV + kvh
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(cache_ptr + row[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if CAUSAL:
            s = tl.where((pos[None, :] <= q_pos[:, None]) & n_mask[None, :], s, float("-inf"))
        else:
            s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(cache_ptr + v_offset + row[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc / tl.where(l_i > 0, l_i, 1.0)[:, None]


@triton.jit(do_not_specialize=["stride_tb"], do_not_specialize_on_alignment=["tables_ptr", "seq_lens_ptr"])
def _decode_kernel(
    q_ptr, cache_ptr, out_ptr, tables_ptr, seq_lens_ptr, scale, v_offset,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_tb,
    BLOCK_SIZE: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
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
    q = (q.to(tl.float32) * scale).to(cache_ptr.dtype.element_ty)
    out = attend_query_tile(q, offs_g, cache_ptr, tables_ptr + b * stride_tb, kvh, v_offset, seq_len,
                             BLOCK_G, BLOCK_SIZE, HKV, D, BLOCK_D, BLOCK_N, PRECISION, CAUSAL=False)
    tl.store(out_ptr + b * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["stride_tb"],
            do_not_specialize_on_alignment=["tables_ptr", "query_start_ptr", "context_lens_ptr", "seq_lens_ptr",
                                            "tile_seq_ptr", "tile_offset_ptr"])
def _prefill_kernel(
    q_ptr, cache_ptr, out_ptr, tables_ptr, query_start_ptr, context_lens_ptr, seq_lens_ptr,
    tile_seq_ptr, tile_offset_ptr, scale, v_offset,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_tb,
    BLOCK_SIZE: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    h = tl.program_id(1)
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
    q = (q.to(tl.float32) * scale).to(cache_ptr.dtype.element_ty)
    q_pos = context + offs_m  # absolute positions: query i sees keys 0 .. q_pos[i]
    end = tl.minimum(seq_len, context + q_offset + BLOCK_M)
    end = tl.where(q_offset < seq_len - context, end, 0)  # a tile past the new tokens (graph padding) reads nothing
    out = attend_query_tile(q, q_pos, cache_ptr, tables_ptr + b * stride_tb, h // GROUP, v_offset, end,
                             BLOCK_M, BLOCK_SIZE, HKV, D, BLOCK_D, BLOCK_N, PRECISION, CAUSAL=True)
    tl.store(out_ptr + (q_start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask)


def precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def store_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write each token's K/V [T, Hkv, D] to its slot; slots < 0 are skipped."""
    tokens = k.shape[0]
    if tokens == 0:
        return
    _, num_blocks, block_size, kv_heads, head_dim = kv_cache.shape
    row = kv_heads * head_dim
    _store_kv_kernel[(tokens,)](
        k, v, kv_cache, slot_mapping, num_blocks * block_size * row, k.stride(0), v.stride(0),
        ROW=row, BLOCK=triton.next_power_of_2(row),
    )


def decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """One query token per sequence: q [B, H, D] -> [B, H, D]."""
    batch, heads, head_dim = q.shape
    _, num_blocks, block_size, kv_heads, _ = kv_cache.shape
    group = heads // kv_heads
    out = torch.empty_like(q)
    tables = meta.block_tables
    _decode_kernel[(batch, kv_heads)](
        q, kv_cache, out, tables, meta.seq_lens, scale, num_blocks * block_size * kv_heads * head_dim,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), tables.stride(0),
        BLOCK_SIZE=block_size, HKV=kv_heads, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        D=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_N=DECODE_BLOCK_N,
        PRECISION=precision(kv_cache.dtype), num_warps=DECODE_NUM_WARPS, PDL=pdl.ENABLED, **pdl.launch_options(),
    )
    return out


def prefill_tiles(query_lens: list[int], block_m: int) -> tuple[list[int], list[int]]:
    """(sequence index, first query offset) of every BLOCK_M-query tile of the step's sequences."""
    seqs: list[int] = []
    offsets: list[int] = []
    for b, n in enumerate(query_lens):
        for off in range(0, n, block_m):
            seqs.append(b)
            offsets.append(off)
    return seqs, offsets


def prefill_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Packed queries of any lengths, q [T, H, D] -> [T, H, D], over keys already in the cache."""
    tokens, heads, head_dim = q.shape
    _, num_blocks, block_size, kv_heads, _ = kv_cache.shape
    # the tile map is the same for every layer of the step: build it once per metadata object
    tiles = meta.derived.get("triton_prefill_tiles")
    if tiles is None:
        seqs, offsets = prefill_tiles(meta.query_lens_host, PREFILL_BLOCK_M)
        tiles = host_tensor([seqs, offsets], torch.int32, q.device)
        meta.derived["triton_prefill_tiles"] = tiles
    out = torch.empty_like(q)
    tables = meta.block_tables
    _prefill_kernel[(tiles.shape[1], heads)](
        q, kv_cache, out, tables, meta.query_start_loc, meta.context_lens, meta.seq_lens, tiles[0], tiles[1],
        scale, num_blocks * block_size * kv_heads * head_dim,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), tables.stride(0),
        BLOCK_SIZE=block_size, HKV=kv_heads, GROUP=heads // kv_heads,
        D=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=PREFILL_BLOCK_M, BLOCK_N=PREFILL_BLOCK_N, PRECISION=precision(kv_cache.dtype),
        num_warps=4, num_stages=2,
    )
    return out


def triton_paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor | None,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """The "cuda" attention backend (runtime/models/attention.py's AttentionBackend)."""
    if kv_cache is None:  # cache-less warm-up / profiling pass: the reference path handles it
        from runtime.models.attention import torch_paged_attention

        return torch_paged_attention(q, k, v, kv_cache, meta, scale)
    store_kv(k, v, kv_cache, meta.slot_mapping)
    return attend_over_cache(q, kv_cache, meta, scale)


def attend_over_cache(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Attention of q [T, H, D] over the cache, once the step's new K/V are stored there."""
    if meta.decode is not None:  # a mixed step: its decode-shaped rows first (runtime/cuda/mixed_graphs.py)
        rows = meta.decode_rows
        return torch.cat((decode_attention(q[:rows], kv_cache, meta.decode, scale),
                          prefill_attention(q[rows:], kv_cache, meta, scale)))
    if meta.is_decode_only:
        return decode_attention(q, kv_cache, meta, scale)
    return prefill_attention(q, kv_cache, meta, scale)
