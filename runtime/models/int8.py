"""int8 weight-only copies of the projections for small CPU batches (--cpu-quantization int8).

A decode step at low concurrency streams every weight from memory for a handful of rows, so its
matrix-vector products are bound by bytes read; per-output-channel int8 weights halve those bytes and
ATen's int8 weight-only kernel (`_weight_int8pack_mm`) runs them 2-2.5x faster than the bf16 product on
the 2-core dev box. It loses to bf16 beyond a few rows (AMX multiplies bf16 batches almost for free), so
the bf16 weights stay and serve every batch of more than MAX_ROWS tokens (prefills, busy decode steps).
A request's greedy tokens may then depend on how many others decode beside it: int8 and bf16 round apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

MAX_ROWS = 4  # measured (RESULTS.md, 2026-11-26): int8 wins at 1-4 rows, loses from 16


@dataclass(frozen=True)
class Int8Weight:
    """weight ~= qweight * scale[:, None]; scale in the activations' dtype, as the kernel takes it."""

    qweight: torch.Tensor  # int8 [out, in]
    scale: torch.Tensor  # [out]


def quantize(weight: torch.Tensor) -> Int8Weight:
    """Symmetric per-output-channel int8 (the largest magnitude of each row maps to 127)."""
    w = weight.detach().float()
    # the scale as the kernel will read it (bf16 for a bf16 model), so rounding to it costs at most half a step
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12).to(weight.dtype)
    qweight = torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Weight(qweight.contiguous(), scale)


def dequantize(w: Int8Weight) -> torch.Tensor:
    """The weight the int8 copy stands for (references and tests)."""
    return (w.qweight.float() * w.scale.float()[:, None]).to(w.scale.dtype)


def matmul(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """x [rows, in] @ dequantized(w)^T -> [rows, out] in x's dtype."""
    return torch.ops.aten._weight_int8pack_mm(x.contiguous(), w.qweight, w.scale)


def quantize_model(model: nn.Module) -> int:
    """Give every Linear of `model`, and its output embedding, an int8 copy; the bytes the copies take."""
    from runtime.models.base import CausalLM
    from runtime.models.linear import Linear

    added = 0
    for module in model.modules():
        if isinstance(module, Linear):
            module.int8 = quantize(module.weight)
            added += module.int8.qweight.numel()
    if isinstance(model, CausalLM):
        model.int8_head = quantize(model.output_embedding())
        added += model.int8_head.qweight.numel()
    return added
