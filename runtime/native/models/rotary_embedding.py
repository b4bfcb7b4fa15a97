"""Rotary position embeddings (rotate-half layout, as HF Llama) with the frequency scalings of the families we serve:
linear, Llama 3, YaRN (gpt-oss, long-context Qwen3), LongRoPE (Phi-3/Phi-4), and partial rotation (Phi-4-mini)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from runtime.model_spec import RopeConfig


def _inv_freq(dim: int, rope: RopeConfig, max_positions: int, context_window: int) -> tuple[torch.Tensor, float]:
    """The inverse frequencies of `dim` rotated dims and the factor cos/sin are scaled by (YaRN, LongRoPE)."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (rope.theta**exponents)
    params = rope.params
    if rope.rope_type == "linear":
        return inv_freq / float(params["factor"]), 1.0
    if rope.rope_type == "llama3":
        return _llama3_scale(inv_freq, params), 1.0
    if rope.rope_type == "yarn":
        return _yarn(dim, rope, max_positions)
    if rope.rope_type == "longrope":
        return _longrope(dim, rope, max_positions, context_window)
    # "dynamic" (NTK) leaves frequencies unchanged inside the original window, which is the window we
    # serve (max_position_embeddings), so it equals "default" here.
    return inv_freq, 1.0


def _yarn(dim: int, rope: RopeConfig, max_positions: int) -> tuple[torch.Tensor, float]:
    """YaRN as transformers computes it (_compute_yarn_parameters): interpolate low frequencies by `factor`,
    keep high ones, ramp between the dims that rotate beta_slow and beta_fast times in the original window."""
    params = rope.params
    original = float(params["original_max_position_embeddings"])
    factor = float(params.get("factor") or max_positions / original)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast, beta_slow = float(params.get("beta_fast") or 32), float(params.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def _longrope(dim: int, rope: RopeConfig, max_positions: int, context_window: int) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3/Phi-4): per-dim factors, the long ones when the served context is longer than the original
    window (vLLM's choice: one set for every sequence; transformers switches per sequence and recomputes its cache
    when one grows past the window), and cos/sin scaled by sqrt(1 + log(factor) / log(original))."""
    params = rope.params
    original = int(params.get("original_max_position_embeddings") or max_positions)
    factors = params["long_factor"] if context_window > original else params["short_factor"]
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (torch.tensor(factors, dtype=torch.float32) * rope.theta**exponents)
    factor = float(params.get("factor") or max_positions / original)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return inv_freq, float(attention_factor)


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
    """Applies RoPE to packed q [T, heads*D] and k [T, kv_heads*D] at the given positions; with a partial rotary
    factor, to the first `rotary_dim` dims of each head only."""

    def __init__(self, head_dim: int, max_positions: int, rope: RopeConfig, context_window: int | None = None) -> None:
        super().__init__()
        rope.check()
        self.head_dim = head_dim
        self.rotary_dim = int(head_dim * rope.partial_rotary_factor)
        inv_freq, scale = _inv_freq(self.rotary_dim, rope, max_positions, context_window or max_positions)
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        # float32 cache (with YaRN's or LongRoPE's factor in it, as HF scales cos and sin); cast to the activations'
        # dtype at use, as HF does
        self.register_buffer("cos_cache", freqs.cos() * scale, persistent=False)
        self.register_buffer("sin_cache", freqs.sin() * scale, persistent=False)
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
        if self.rotary_dim != self.head_dim:  # partial: the first rotary_dim dims of each head turn, the rest stay
            heads = x.view(shape[0], -1, self.head_dim)
            turned = self._rotate_all(heads[..., : self.rotary_dim].reshape(shape[0], -1), cos, sin, self.rotary_dim)
            return torch.cat((turned.view(shape[0], -1, self.rotary_dim), heads[..., self.rotary_dim :]),
                             dim=-1).view(shape)
        return self._rotate_all(x, cos, sin, self.head_dim)

    @staticmethod
    def _rotate_all(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dim: int) -> torch.Tensor:
        shape = x.shape
        x = x.view(shape[0], -1, 2, dim // 2)
        # (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) = x * (cos, cos) + (x2, x1) * (-sin, sin):
        # rotate_half as a flip of the halves; the same products and sums, so the same roundings
        out = (x * cos.view(-1, 1, 2, dim // 2)).view(shape[0], -1, dim)
        out += (x.flip(2) * sin.view(-1, 1, 2, dim // 2)).view(shape[0], -1, dim)
        return out.view(shape)
