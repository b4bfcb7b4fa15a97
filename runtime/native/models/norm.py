"""Normalisation layers: RMSNorm (Llama family) and LayerNorm (GPT-2)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 and cast back before the weight, as HF Llama does.

    `offset` 1 scales by (1 + weight), Gemma's convention (its checkpoints store weight - 1); `weight_in_float32`
    multiplies by the weight before the cast back (Gemma, gpt-oss)."""

    def __init__(self, dim: int, eps: float, *, dtype: torch.dtype = torch.float32, offset: float = 0.0,
                 weight_in_float32: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight_in_float32 = weight_in_float32 or offset != 0.0
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype == self.weight.dtype == torch.float32 and not self.offset:
            # torch's CPU kernel runs these same ops in C++ (one Python dispatch instead of eight);
            # bit-identical in float32, where there is no cast to place
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight_in_float32:
            return (x32 * (self.offset + self.weight.float())).to(x.dtype)
        return self.weight * x32.to(x.dtype)


class LayerNorm(nn.Module):
    """Standard LayerNorm with weight and bias."""

    def __init__(self, dim: int, eps: float, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
