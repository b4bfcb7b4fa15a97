"""How many KV blocks the native runtime allocates.

Order of precedence:
1. `max_kv_tokens` set: exactly enough blocks for that many tokens.
2. CUDA: `kv_cache_fraction` of the device memory still free after the weights were loaded
   (torch.cuda.mem_get_info), minus what one step of `max_num_tokens` tokens needs for activations
   (measured by the caller's warm-up forward pass and passed in as `activation_bytes`).
3. CPU: what the configured batch and context need: one full context window, which the batch's sequences share
   (past it the scheduler queues or preempts), and at least a block for each of `max_batch_size` sequences;
   `max_kv_tokens` gives it more. The default model's 8,192-token window takes 180 MiB in bf16. (Before
   2026-11-28 it took a quarter of the available host memory, 3.6-6 GB of a 2-core box's 24 GiB, for a model whose
   whole process then served in under 1 GB: benchmarks/RESULTS.md.)
In every case the cache must hold at least one full context window, or a request could never finish.
"""

from __future__ import annotations

import logging

import torch

from runtime.config import EngineConfig

logger = logging.getLogger(__name__)


def num_kv_blocks(
    config: EngineConfig,
    bytes_per_token: int,
    context_window: int,
    device: torch.device,
    activation_bytes: int = 0,
) -> int:
    """Number of KV blocks of `config.kv_block_size` tokens (see the module docstring)."""
    block_size = config.kv_block_size
    bytes_per_block = bytes_per_token * block_size
    min_blocks = -(-context_window // block_size)
    if config.max_kv_tokens is not None:
        blocks = -(-config.max_kv_tokens // block_size)
        source = f"max_kv_tokens={config.max_kv_tokens}"
    elif device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        budget = int((free - activation_bytes) * config.kv_cache_fraction)
        blocks = max(0, budget) // bytes_per_block
        source = f"{config.kv_cache_fraction} of {free / 2**30:.2f} GiB free on {device} minus activations"
    else:
        blocks = max(min_blocks, config.max_batch_size)
        source = "one context window for the batch; --max-kv-tokens for more"
    if blocks < min_blocks:
        raise ValueError(
            f"the KV cache ({source}) holds {blocks * block_size} tokens, fewer than one context window "
            f"({context_window}); raise max_kv_tokens / kv_cache_fraction or lower max_model_len"
        )
    logger.info(
        "KV cache%s: %d blocks x %d tokens = %d tokens, %.1f MiB (%s)",
        " (FP8)" if config.kv_cache_dtype == "fp8" else "",
        blocks, block_size, blocks * block_size, blocks * bytes_per_block / 2**20, source,
    )
    return blocks
