"""Paged attention: write new K/V into the block cache, then attend causally over each sequence's cache.

`Attention` is the layer the model files use; the work is done by a backend chosen by device type.
`torch_paged_attention` is the reference backend (any device). A faster kernel (Triton on CUDA, C++ for CPU
decode steps: runtime/cpu/paged_attention.py) plugs in with `register_attention_backend("cuda", fn)` without touching model files.
Cache layout per layer: [2, num_blocks, block_size, num_kv_heads, head_dim] (kv_cache.py).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from runtime.attention_metadata import AttentionMetadata


class AttentionBackend(Protocol):
    """q [T, H, D], k/v [T, Hkv, D] of the new tokens -> output [T, H, D]; stores k/v in the cache."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor: ...


_BACKENDS: dict[str, AttentionBackend] = {}


def register_attention_backend(device_type: str, backend: AttentionBackend) -> None:
    """Use `backend` for tensors on `device_type` ("cuda", "cpu", ...) from now on."""
    _BACKENDS[device_type] = backend


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store each new token's K/V at its slot (block_id * block_size + offset)."""
    _, _, block_size, kv_heads, head_dim = kv_cache.shape
    if torch.compiler.is_compiling():
        # one index_put_ into the cache tensor itself: inductor keeps it in place, where a write through a view
        # of the cache (below) becomes a copy of the whole cache (runtime/cpu/compiled_decode.py)
        tokens = k.shape[0]
        which = torch.arange(2, device=k.device).repeat_interleave(tokens)
        blocks, offsets = (slot_mapping // block_size).repeat(2), (slot_mapping % block_size).repeat(2)
        kv_cache.index_put_((which, blocks, offsets), torch.cat((k, v)).to(kv_cache.dtype))
        return
    kv_cache[0].view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(kv_cache.dtype))
    kv_cache[1].view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(kv_cache.dtype))


def torch_paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor | None,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Reference backend on top of scaled_dot_product_attention.

    Decode-only steps run as one batched call over a padded gather of the blocks; steps with any
    multi-token query (prefill, prefill chunks, speculative scoring) loop over sequences.
    Without a cache (kv_cache None, e.g. a warm-up run) every sequence must start at position 0.
    """
    if kv_cache is None:
        return _varlen_attention(q, k, v, None, meta, scale)
    write_kv(k, v, kv_cache, meta.slot_mapping)
    if meta.is_decode_only:
        return _decode_attention(q, kv_cache, meta, scale)
    return _varlen_attention(q, k, v, kv_cache, meta, scale)


def _decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    batch = q.shape[0]  # one token per sequence (not meta.num_seqs: a compiled step must not guard on a list)
    _, cache_blocks, _, kv_heads, head_dim = kv_cache.shape
    blocks, bias = _decode_inputs(meta, q.dtype, q.device)
    # K and V of every sequence's blocks in one index_select of whole blocks (row copies; advanced
    # indexing `cache[tables]` copies element by element and cost as much as the layer's matmuls)
    kv = kv_cache.view(2, cache_blocks, -1).index_select(1, blocks.view(-1)).view(2, batch, -1, kv_heads, head_dim)
    kv = kv.to(q.dtype).transpose(2, 3)  # [2, B, Hkv, L, D]
    # grouped-query attention without repeating K/V: a group's query heads become the query length
    out = F.scaled_dot_product_attention(
        q.reshape(batch, kv_heads, -1, head_dim),  # [B, Hkv, H/Hkv, D]
        kv[0],
        kv[1],
        attn_mask=bias,
        scale=scale,
    )
    return out.view(q.shape)


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
    already: runtime/cpu/compiled_decode.py)."""
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
) -> torch.Tensor:
    out = torch.empty_like(q)
    start = 0
    for b, (query_len, seq_len) in enumerate(zip(meta.query_lens_host, meta.seq_lens_host)):
        end = start + query_len
        context_len = seq_len - query_len
        if context_len == 0:
            # the whole sequence is new: attend to the fresh K/V, no gather needed
            keys, values = k[start:end], v[start:end]
        elif kv_cache is None:
            raise ValueError("a sequence with cached context needs a KV cache")
        else:
            keys, values = _gather(kv_cache, meta.block_tables[b], seq_len, meta.block_size)
        mask = None
        if query_len > 1 and context_len > 0:
            # query i sits at position context_len + i and sees keys 0..context_len + i
            rows = torch.arange(query_len, device=q.device)[:, None] + context_len
            mask = torch.arange(seq_len, device=q.device)[None, :] <= rows
        o = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1).unsqueeze(0),  # [1, H, q, D]
            keys.transpose(0, 1).unsqueeze(0).to(q.dtype),  # [1, Hkv, s, D]
            values.transpose(0, 1).unsqueeze(0).to(q.dtype),
            attn_mask=mask,
            is_causal=query_len > 1 and context_len == 0,
            scale=scale,
            enable_gqa=q.shape[1] != keys.shape[1],
        )
        out[start:end] = o[0].transpose(0, 1)
        start = end
    return out


def _gather(
    kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's first `seq_len` cached keys and values, each [seq_len, Hkv, D]."""
    blocks = block_table[: -(-seq_len // block_size)].long()
    _, _, _, kv_heads, head_dim = kv_cache.shape
    keys = kv_cache[0][blocks].view(-1, kv_heads, head_dim)[:seq_len]
    values = kv_cache[1][blocks].view(-1, kv_heads, head_dim)[:seq_len]
    return keys, values


class Attention(nn.Module):
    """Multi-head / grouped-query attention over the paged cache, for packed q/k/v [T, heads*D]."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        tokens = q.shape[0]
        backend = _BACKENDS.get(q.device.type, torch_paged_attention)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if meta.decode is None:
            out = backend(q, k, v, kv_cache, meta, self.scale)
        else:  # a mixed step: its decode-shaped rows first, then the sequences `meta` describes
            rows = meta.decode_rows
            out = torch.cat((backend(q[:rows], k[:rows], v[:rows], kv_cache, meta.decode, self.scale),
                             backend(q[rows:], k[rows:], v[rows:], kv_cache, meta, self.scale)))
        return out.reshape(tokens, self.num_heads * self.head_dim)
