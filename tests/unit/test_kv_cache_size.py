"""The CPU's KV cache: one context window that the batch shares, --max-kv-tokens for more (issue 47)."""

from __future__ import annotations

import pytest
import torch

from runtime.config import EngineConfig
from runtime.native.kv_cache import num_kv_blocks

CPU = torch.device("cpu")


def test_cpu_cache_is_one_context_window_whatever_the_host_memory() -> None:
    assert num_kv_blocks(EngineConfig(kv_block_size=16), 23040, 8192, CPU) == 512


def test_cpu_cache_has_a_block_per_sequence_when_the_batch_outnumbers_the_window() -> None:
    assert num_kv_blocks(EngineConfig(kv_block_size=16, max_batch_size=64), 1024, 256, CPU) == 64


def test_max_kv_tokens_gives_the_cpu_cache_more() -> None:
    assert num_kv_blocks(EngineConfig(kv_block_size=16, max_kv_tokens=20000), 23040, 8192, CPU) == 1250


def test_max_kv_tokens_below_one_window_is_refused() -> None:
    with pytest.raises(ValueError, match="fewer than one context window"):
        num_kv_blocks(EngineConfig(kv_block_size=16, max_kv_tokens=4096), 23040, 8192, CPU)
