"""Paged attention: write new K/V into the block cache, then attend causally over each sequence's cache.

`Attention` is the layer the model files use; the work is done by a backend chosen by device type.
`torch_paged_attention` is the reference backend (any device, used on CPU). A faster kernel (e.g.
Triton on CUDA) plugs in with `register_attention_backend("cuda", fn)` without touching model files.
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
    _, _, _, kv_heads, head_dim = kv_cache.shape
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
    batch, block_size = meta.num_seqs, meta.block_size
    num_blocks = -(-meta.max_seq_len // block_size)
    tables = meta.block_tables[:, :num_blocks].long()
    length = num_blocks * block_size
    _, _, _, kv_heads, head_dim = kv_cache.shape
    # [B, blocks, block_size, Hkv, D] -> [B, Hkv, L, D]; padding past seq_len is masked out below
    keys = kv_cache[0][tables].view(batch, length, kv_heads, head_dim).transpose(1, 2).to(q.dtype)
    values = kv_cache[1][tables].view(batch, length, kv_heads, head_dim).transpose(1, 2).to(q.dtype)
    valid = torch.arange(length, device=q.device)[None, :] < meta.seq_lens.to(q.device)[:, None]
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2),  # [B, H, 1, D]
        keys,
        values,
        attn_mask=valid[:, None, None, :],
        scale=scale,
        enable_gqa=q.shape[1] != kv_heads,
    )
    return out.squeeze(2)


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
        out = backend(
            q.view(tokens, self.num_heads, self.head_dim),
            k.view(tokens, self.num_kv_heads, self.head_dim),
            v.view(tokens, self.num_kv_heads, self.head_dim),
            kv_cache,
            meta,
            self.scale,
        )
        return out.reshape(tokens, self.num_heads * self.head_dim)
