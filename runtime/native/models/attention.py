"""Paged attention: write new K/V into the block cache, then attend causally over each sequence's cache.

`Attention` is the layer the model files use; the work is done by a backend chosen by device type.
`torch_paged_attention` is the reference backend (any device). A faster kernel (Triton on CUDA, C++ for CPU
decode steps: runtime/native/cpu/paged_attention.py) plugs in with `register_attention_backend("cuda", fn)` without touching model files.
Cache layout per layer: [2, num_blocks, block_size, num_kv_heads, head_dim] (kv_cache.py).

An FP8 cache (--kv-cache-dtype fp8) holds K / k_scale and V / v_scale in E4M3, read back times the scale
(runtime/native/models/kv_scales.py); every backend takes the layer's `kv_scales` (1 and 1 for 16-bit caches).

Two per-layer options every backend takes: `window`, a sliding window (a query at position p sees the keys at
p - window + 1 .. p; blocks wholly before that are not read), and `sinks`, a learned logit per query head that joins
every softmax's denominator without a value (gpt-oss's attention sinks).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from runtime.native.attention_metadata import AttentionMetadata
from runtime.native.models.kv_scales import FP8, UNIT, KvScales, cache_scales


class AttentionBackend(Protocol):
    """q [T, H, D], k/v [T, Hkv, D] of the new tokens -> output [T, H, D]; stores k/v in the cache. `window`: the
    layer's sliding window (None: every key); `sinks`: float32 [H] logits of its attention sinks (None: none);
    `kv_scales`: the FP8 cache's scales of the layer."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
        kv_scales: KvScales = UNIT,
    ) -> torch.Tensor: ...


_BACKENDS: dict[str, AttentionBackend] = {}


def register_attention_backend(device_type: str, backend: AttentionBackend) -> None:
    """Use `backend` for tensors on `device_type` ("cuda", "cpu", ...) from now on."""
    _BACKENDS[device_type] = backend


def as_cached(t: torch.Tensor, kv_cache: torch.Tensor | None, scale: float = 1.0) -> torch.Tensor:
    """Fresh keys or values `t` as attention reads them back from `kv_cache`: an FP8 cache's saturate(t / scale) in
    E4M3 (--kv-cache-dtype fp8; the cast saturates at +-448) times `scale`, as they are where every key comes from
    the cache (CUDA)."""
    if kv_cache is None or kv_cache.dtype != FP8:
        return t
    return dequantized(to_cache(t, FP8, scale), t.dtype, scale)


def to_cache(t: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """Keys or values as a cache of `dtype` stores them: divided by the layer's `scale` (in float32) first."""
    return t.to(dtype) if scale == 1.0 else (t.float() / scale).to(dtype)


def dequantized(cached: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """Cached keys or values as attention reads them: in `dtype`, times the layer's `scale`."""
    return cached.to(dtype) if scale == 1.0 else cached.to(dtype) * scale


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
             kv_scales: KvScales = UNIT) -> None:
    """Store each new token's K/V at its slot (block_id * block_size + offset), divided by the layer's scales."""
    _, _, block_size, kv_heads, head_dim = kv_cache.shape
    k, v = to_cache(k, kv_cache.dtype, kv_scales.k), to_cache(v, kv_cache.dtype, kv_scales.v)
    if torch.compiler.is_compiling():
        # one index_put_ into the cache tensor itself: inductor keeps it in place, where a write through a view
        # of the cache (below) becomes a copy of the whole cache (runtime/native/cpu/compiled_decode.py)
        tokens = k.shape[0]
        which = torch.arange(2, device=k.device).repeat_interleave(tokens)
        blocks, offsets = (slot_mapping // block_size).repeat(2), (slot_mapping % block_size).repeat(2)
        kv_cache.index_put_((which, blocks, offsets), torch.cat((k, v)))
        return
    if kv_cache.dtype == FP8:  # as bytes: index_copy_ has no float8 kernel on CPU
        kv_cache, k, v = kv_cache.view(torch.uint8), k.view(torch.uint8), v.view(torch.uint8)
    kv_cache[0].view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    kv_cache[1].view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def torch_paged_attention(
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
    """Reference backend on top of scaled_dot_product_attention (a plain softmax where sinks join it).

    Decode-only steps run as one batched call over a padded gather of the blocks; steps with any
    multi-token query (prefill, prefill chunks, speculative scoring) loop over sequences.
    Without a cache (kv_cache None, e.g. a warm-up run) every sequence must start at position 0.
    """
    if kv_cache is None:
        return _varlen_attention(q, k, v, None, meta, scale, window, sinks)
    write_kv(k, v, kv_cache, meta.slot_mapping, kv_scales)
    if meta.is_decode_only:
        return _decode_attention(q, kv_cache, meta, scale, window, sinks, kv_scales)
    return _varlen_attention(q, k, v, kv_cache, meta, scale, window, sinks, kv_scales)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool, scale: float,
            sinks: torch.Tensor | None) -> torch.Tensor:
    """SDPA of q [N, Hq, Lq, D] over k/v [N, Hk, Lk, D] (Hq a multiple of Hk); `sinks` (broadcast to the scores
    [N, Hq, Lq, 1]) joins each softmax as one more logit without a value, as transformers' gpt-oss does it."""
    if sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                              enable_gqa=q.shape[1] != k.shape[1])
    if q.shape[1] != k.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scores = (q @ k.transpose(-1, -2)).float() * scale
    if causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    logits = torch.cat((scores, sinks.float().expand(*scores.shape[:-1], 1)), dim=-1)
    probs = torch.softmax(logits, dim=-1)[..., :-1]
    return (probs.to(v.dtype) @ v).to(q.dtype)


def _decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                      window: int | None, sinks: torch.Tensor | None, kv_scales: KvScales) -> torch.Tensor:
    batch = q.shape[0]  # one token per sequence (not meta.num_seqs: a compiled step must not guard on a list)
    _, cache_blocks, _, kv_heads, head_dim = kv_cache.shape
    blocks, bias = _decode_inputs(meta, q.dtype, q.device)
    if window is not None:
        bias = _window_bias(meta, bias, window)
    # K and V of every sequence's blocks in one index_select of whole blocks (row copies; advanced
    # indexing `cache[tables]` copies element by element and cost as much as the layer's matmuls)
    kv = kv_cache.view(2, cache_blocks, -1).index_select(1, blocks.view(-1)).view(2, batch, -1, kv_heads, head_dim)
    kv = kv.transpose(2, 3)  # [2, B, Hkv, L, D]
    keys, values = dequantized(kv[0], q.dtype, kv_scales.k), dequantized(kv[1], q.dtype, kv_scales.v)
    # grouped-query attention without repeating K/V: a group's query heads become the query length
    group_q = q.reshape(batch, kv_heads, -1, head_dim)  # [B, Hkv, H/Hkv, D]
    out = _attend(group_q, keys, values, bias, False, scale,
                  None if sinks is None else sinks.view(kv_heads, -1, 1))
    return out.reshape(q.shape)


def _window_bias(meta: AttentionMetadata, bias: torch.Tensor, window: int) -> torch.Tensor:
    """The decode mask with keys before each row's window masked too (made once per step and window)."""
    key = ("cpu_decode_window", window, bias.dtype)
    if key not in meta.derived:
        starts = meta.seq_lens.to(bias.device) - window  # each row's first visible key
        early = torch.arange(bias.shape[-1], device=bias.device)[None, :] < starts[:, None]
        meta.derived[key] = bias.masked_fill(early[:, None, None, :], float("-inf"))
    return meta.derived[key]


def decode_inputs(block_tables: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int, block_size: int,
                  dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `num_blocks` blocks of each row's table to gather (contiguous [B, num_blocks]) and the additive
    mask [B, 1, 1, num_blocks * block_size]: -inf past the row's seq_len. A float mask, because SDPA converts
    a boolean one on every call."""
    length = num_blocks * block_size
    # a fresh tensor: `.contiguous()` keeps the table's row stride for a single row, which a compiled step guards on
    blocks = torch.empty((len(block_tables), num_blocks), dtype=block_tables.dtype, device=device)
    blocks.copy_(block_tables[:, :num_blocks])
    pad = torch.arange(length, device=device)[None, :] >= seq_lens.to(device)[:, None]
    bias = torch.zeros(len(seq_lens), 1, 1, length, dtype=dtype, device=device)
    return blocks, bias.masked_fill_(pad[:, None, None, :], float("-inf"))


def _decode_inputs(
    meta: AttentionMetadata, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """`decode_inputs` of the step, made once and reused by every layer (a compiled decode step finds them made
    already: runtime/native/cpu/compiled_decode.py)."""
    key = ("cpu_decode", dtype, device)
    if key not in meta.derived:
        num_blocks = -(-meta.max_seq_len // meta.block_size)
        meta.derived[key] = decode_inputs(meta.block_tables, meta.seq_lens, num_blocks, meta.block_size, dtype, device)
    return meta.derived[key]


def _varlen_attention(
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
    out = torch.empty_like(q)
    start = 0
    head_sinks = None if sinks is None else sinks.view(-1, 1, 1)
    for b, (query_len, seq_len) in enumerate(zip(meta.query_lens_host, meta.seq_lens_host)):
        end = start + query_len
        context_len = seq_len - query_len
        # the first key any of these queries sees; a window's older blocks are not gathered
        first = 0 if window is None else max(0, context_len - window + 1) // meta.block_size * meta.block_size
        if context_len == 0:
            # the whole sequence is new: attend to the fresh K/V, no gather needed
            first = 0
            keys = as_cached(k[start:end], kv_cache, kv_scales.k)
            values = as_cached(v[start:end], kv_cache, kv_scales.v)
        elif kv_cache is None:
            raise ValueError("a sequence with cached context needs a KV cache")
        else:
            keys, values = _gather(kv_cache, meta.block_tables[b], first, seq_len, meta.block_size)
            keys, values = dequantized(keys, q.dtype, kv_scales.k), dequantized(values, q.dtype, kv_scales.v)
        mask = None
        windowed = window is not None and seq_len - first > window  # a query has keys outside its window
        if query_len > 1 and context_len > 0 or windowed:
            # query i sits at position context_len + i and sees keys context_len + i - window + 1 .. context_len + i
            rows = torch.arange(query_len, device=q.device)[:, None] + context_len
            positions = torch.arange(first, seq_len, device=q.device)[None, :]
            mask = positions <= rows
            if window is not None:
                mask &= positions > rows - window
        o = _attend(
            q[start:end].transpose(0, 1).unsqueeze(0),  # [1, H, q, D]
            keys.transpose(0, 1).unsqueeze(0),  # [1, Hkv, s, D]
            values.transpose(0, 1).unsqueeze(0),
            mask, query_len > 1 and mask is None, scale, head_sinks,
        )
        out[start:end] = o[0].transpose(0, 1)
        start = end
    return out


def _gather(
    kv_cache: torch.Tensor, block_table: torch.Tensor, first: int, seq_len: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's cached keys and values at positions first .. seq_len - 1 (`first` starts a block), each
    [seq_len - first, Hkv, D]."""
    blocks = block_table[first // block_size : -(-seq_len // block_size)].long()
    _, _, _, kv_heads, head_dim = kv_cache.shape
    keys = kv_cache[0][blocks].view(-1, kv_heads, head_dim)[: seq_len - first]
    values = kv_cache[1][blocks].view(-1, kv_heads, head_dim)[: seq_len - first]
    return keys, values


class Attention(nn.Module):
    """Multi-head / grouped-query attention over the paged cache, for packed q/k/v [T, heads*D]; `window`: this
    layer's sliding window (None: full attention)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 window: int | None = None) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.window = window
        self.kv_scales = UNIT  # an FP8 cache's, from the checkpoint (runtime/native/models/kv_scales.py)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        tokens = q.shape[0]
        backend = _BACKENDS.get(q.device.type, torch_paged_attention)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        options = {"window": self.window, "sinks": sinks, "kv_scales": cache_scales(self.kv_scales, kv_cache)}
        if meta.decode is None:
            out = backend(q, k, v, kv_cache, meta, self.scale, **options)
        else:  # a mixed step: its decode-shaped rows first, then the sequences `meta` describes
            rows = meta.decode_rows
            out = torch.cat((backend(q[:rows], k[:rows], v[:rows], kv_cache, meta.decode, self.scale, **options),
                             backend(q[rows:], k[rows:], v[rows:], kv_cache, meta, self.scale, **options)))
        return out.reshape(tokens, self.num_heads * self.head_dim)


def attention_layers(model: nn.Module) -> list[Attention]:
    """`model`'s attention modules in layer order (the i-th reads the i-th KV cache)."""
    return [m for m in model.modules() if isinstance(m, Attention)]
