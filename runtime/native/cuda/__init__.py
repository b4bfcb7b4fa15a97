"""CUDA execution of the native runtime: Triton paged attention, fused elementwise kernels, decode graphs.

Everything here is imported only when a model runs on a CUDA device (Triton is not needed on CPU).
"""

from __future__ import annotations

import logging

from torch import nn

logger = logging.getLogger(__name__)


def enable_cuda_kernels(model: nn.Module) -> None:
    """Route attention on CUDA tensors through the Triton backend and fuse `model`'s elementwise layers."""
    from runtime.native.cuda.fused import use_fused_kernels
    from runtime.native.cuda.moe import use_fused_experts
    from runtime.native.cuda.paged_attention import triton_paged_attention
    from runtime.native.models.attention import register_attention_backend

    register_attention_backend("cuda", triton_paged_attention)
    fused = use_fused_kernels(model) + use_fused_experts(model)
    logger.info("CUDA kernels: Triton paged attention, %d modules on fused Triton kernels", fused)
