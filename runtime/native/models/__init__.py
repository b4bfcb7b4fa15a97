"""Model definitions in plain PyTorch over the paged KV cache, and the checkpoint loader.

Public surface (used by the engine's model runner):
    load_model(path, dtype, device) -> CausalLM
    CausalLM.forward(input_ids, positions, kv_caches, meta) -> hidden [T, hidden]
    CausalLM.compute_logits(hidden) -> float32 [N, vocab]
    allocate_kv_cache(spec, num_blocks, block_size, dtype, device) -> list[Tensor]
    kv_cache_bytes_per_token(spec, dtype) -> int
What a checkpoint is (ModelSpec) and whether we serve it are told without torch: runtime/model_spec.py,
runtime/architectures.py.
"""

from runtime.native.models.base import CausalLM
from runtime.native.models.kv_cache import allocate_kv_cache, kv_cache_bytes_per_token
from runtime.native.models.loader import load_model

__all__ = ["CausalLM", "allocate_kv_cache", "kv_cache_bytes_per_token", "load_model"]
