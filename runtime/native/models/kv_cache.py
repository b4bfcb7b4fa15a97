"""The paged KV cache's memory layout: one tensor per layer, [2, num_blocks, block_size, kv_heads, head_dim]."""

from __future__ import annotations

import torch

from runtime.model_spec import ModelSpec
from runtime.native.parallel.group import current


def _kv_heads(spec: ModelSpec) -> int:
    """The KV heads this rank caches (all of them outside tensor parallelism)."""
    return current().kv_heads(spec.num_kv_heads)[1]


def kv_cache_bytes_per_token(spec: ModelSpec, dtype: torch.dtype) -> int:
    """Bytes one cached token takes across all layers (K and V), on this rank."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * spec.num_layers * _kv_heads(spec) * spec.head_dim * element


def allocate_kv_cache(
    spec: ModelSpec, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str
) -> list[torch.Tensor]:
    """Zeroed cache tensors, one per layer; index 0 of the first dim holds keys, 1 values."""
    shape = (2, num_blocks, block_size, _kv_heads(spec), spec.head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
