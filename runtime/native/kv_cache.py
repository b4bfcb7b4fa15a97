"""How many KV blocks the native runtime allocates.

Order of precedence:
1. `max_kv_tokens` set: exactly enough blocks for that many tokens.
2. CUDA: `kv_cache_fraction` of the device memory still free after the weights were loaded
   (torch.cuda.mem_get_info), minus what one step of `max_num_tokens` tokens needs for activations
   (measured by the caller's warm-up forward pass and passed in as `activation_bytes`).
3. CPU: `kv_cache_fraction` of a host budget, a quarter of the memory the OS reports available
   (the rest stays with the process, the weights already loaded and everything else on the machine),
   capped by what the scheduler can ever use: `max_batch_size` sequences of a full context window.
In every case the cache must hold at least one full context window, or a request could never finish.
"""

from __future__ import annotations

import logging
import os

import torch

from runtime.config import EngineConfig

logger = logging.getLogger(__name__)

HOST_BUDGET_SHARE = 0.25  # of available host memory, before kv_cache_fraction


def host_available_bytes() -> int:
    """Memory the OS could give us now (MemAvailable; free physical pages where /proc is absent)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


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
        available = host_available_bytes()
        budget = int(available * HOST_BUDGET_SHARE * config.kv_cache_fraction)
        useful = config.max_batch_size * min_blocks  # the scheduler never holds more
        blocks = max(min_blocks, min(budget // bytes_per_block, useful))
        source = (
            f"{config.kv_cache_fraction} x {HOST_BUDGET_SHARE} of {available / 2**30:.2f} GiB available host "
            f"memory, capped at max_batch_size x context window"
        )
    if blocks < min_blocks:
        raise ValueError(
            f"the KV cache ({source}) holds {blocks * block_size} tokens, fewer than one context window "
            f"({context_window}); raise max_kv_tokens / kv_cache_fraction or lower max_model_len"
        )
    logger.info(
        "KV cache: %d blocks x %d tokens = %d tokens, %.1f MiB (%s)",
        blocks, block_size, blocks * block_size, blocks * bytes_per_block / 2**20, source,
    )
    return blocks
