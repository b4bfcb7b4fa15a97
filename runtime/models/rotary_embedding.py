"""Rotary position embeddings (rotate-half layout, as HF Llama), with Llama 3 / linear frequency scaling."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

ROPE_TYPES = ("default", "linear", "dynamic", "llama3")


@dataclass
class RopeConfig:
    """RoPE settings, whichever way the config spells them."""

    theta: float
    rope_type: str
    params: dict[str, Any]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "RopeConfig":
        # transformers>=5 writes "rope_parameters" (theta inside); older checkpoints write
        # "rope_theta" plus an optional "rope_scaling" dict with "type" or "rope_type".
        params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
        rope_type = str(params.get("rope_type", params.get("type", "default")))
        return cls(theta=theta, rope_type=rope_type, params=params)


def _inv_freq(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.rope_type == "linear":
        return inv_freq / float(rope.params["factor"])
    if rope.rope_type == "llama3":
        return _llama3_scale(inv_freq, rope.params)
    # "dynamic" (NTK) leaves frequencies unchanged inside the original window, which is the window we
    # serve (max_position_embeddings), so it equals "default" here.
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate smoothly in between."""
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old_len = float(params["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    interpolated = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, interpolated, scaled)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to packed q [T, heads*D] and k [T, kv_heads*D] at the given positions."""

    def __init__(self, head_dim: int, max_positions: int, rope: RopeConfig) -> None:
        super().__init__()
        if rope.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope type {rope.rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
        self.head_dim = head_dim
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * _inv_freq(head_dim, rope)[None, :]
        # float32 cache; cast to the activations' dtype at use, as HF does
        self.register_buffer("cos_cache", freqs.cos(), persistent=False)
        self.register_buffer("sin_cache", freqs.sin(), persistent=False)
        # (positions, dtype, cos, sin) of the last call: layers of one step reuse it
        self._last: tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._cos_sin(positions, q.dtype)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, 1, D] factors (cos, cos) and (-sin, sin) of the positions. On the CPU they are made once
        per step, since every layer passes the same `positions` tensor (one module serves all layers);
        not on CUDA, where a graph capture must record its own."""
        cached = None if torch.compiler.is_compiling() else self._last
        if cached is not None and cached[0] is positions and cached[1] == dtype:
            return cached[2], cached[3]
        cos = self.cos_cache[positions].to(dtype)  # [T, D/2]
        sin = self.sin_cache[positions].to(dtype)
        cos2 = torch.cat((cos, cos), dim=-1).unsqueeze(1)
        sin2 = torch.cat((-sin, sin), dim=-1).unsqueeze(1)
        if positions.device.type == "cpu" and not torch.compiler.is_compiling():  # a compiled step has no Python
            self._last = (positions, dtype, cos2, sin2)
        return cos2, sin2

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.view(shape[0], -1, 2, self.head_dim // 2)
        # (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) = x * (cos, cos) + (x2, x1) * (-sin, sin):
        # rotate_half as a flip of the halves; the same products and sums, so the same roundings
        out = (x * cos.view(-1, 1, 2, self.head_dim // 2)).view(shape[0], -1, self.head_dim)
        out += (x.flip(2) * sin.view(-1, 1, 2, self.head_dim // 2)).view(shape[0], -1, self.head_dim)
        return out.view(shape)
