"""Model definitions in plain PyTorch over the paged KV cache, and the checkpoint loader.

Public surface (used by the engine's model runner):
    load_model(path, dtype, device) -> CausalLM
    CausalLM.forward(input_ids, positions, kv_caches, meta) -> hidden [T, hidden]
    CausalLM.compute_logits(hidden) -> float32 [N, vocab]
    allocate_kv_cache(spec, num_blocks, block_size, dtype, device) -> list[Tensor]
    kv_cache_bytes_per_token(spec, dtype) -> int
"""

from runtime.models.base import CausalLM
from runtime.models.kv_cache import allocate_kv_cache, kv_cache_bytes_per_token
from runtime.models.loader import load_model
from runtime.models.registry import SUPPORTED_ARCHITECTURES, UnsupportedArchitectureError, check_supported
from runtime.models.spec import ModelSpec

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "CausalLM",
    "ModelSpec",
    "UnsupportedArchitectureError",
    "allocate_kv_cache",
    "check_supported",
    "kv_cache_bytes_per_token",
    "load_model",
]
