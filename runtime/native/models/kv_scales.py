"""Per-tensor scales of an FP8 KV cache (--kv-cache-dtype fp8): one K and one V scale per layer, from the checkpoint.

The cache stores saturate(k / k_scale) in E4M3 and attention reads stored * k_scale (V alike), so a calibrated scale
maps a layer's largest key to about 448 where scale 1 would clip it. The names checkpoints give them, as vLLM reads
them (its `maybe_remap_kv_scale_name` and compressed-tensors' `get_cache_scale`):
- compressed-tensors with a `kv_cache_scheme`: `<layer>.self_attn.k_scale` / `.v_scale`; older ones
  `<layer>.self_attn.k_proj.output_scale` / `v_proj.output_scale`;
- NVIDIA ModelOpt (`kv_cache_quant_algo: FP8`): `<layer>.self_attn.k_proj.k_scale` / `v_proj.v_scale`;
- the deprecated single `<layer>.self_attn.kv_scale`, for both.
A layer with only one of the two uses it for both (vLLM takes the larger). A checkpoint without any: scale 1. With a
16-bit cache the scales are not used (the cache holds the values exactly).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

import torch
from torch import nn

logger = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
_LAYER = re.compile(r"\.(\d+)\.")  # the first index in a name is its decoder layer's
_SUFFIXES = {".k_proj.output_scale": "k", ".v_proj.output_scale": "v", ".k_scale": "k", ".v_scale": "v",
             ".kv_scale": "kv"}


@dataclass(frozen=True)
class KvScales:
    """One layer's K and V scales: the cache holds k / k and v / v, read back times them."""

    k: float = 1.0
    v: float = 1.0


UNIT = KvScales()


def cache_scales(scales: KvScales, kv_cache: torch.Tensor | None) -> KvScales:
    """The scales attention applies to `kv_cache`: the layer's for an FP8 cache, 1 for any other."""
    return scales if kv_cache is not None and kv_cache.dtype == FP8 else UNIT


def is_kv_scale(name: str) -> bool:
    """Whether the checkpoint tensor `name` is a KV-cache scale."""
    return name.endswith(tuple(_SUFFIXES)) and _LAYER.search(name) is not None


class KvScaleReader:
    """Collects a checkpoint's KV-cache scales as the loader reads them, then gives them to the model's layers."""

    def __init__(self) -> None:
        self._found: dict[int, dict[str, float]] = {}  # layer -> "k"/"v"/"kv" -> scale

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Record the scale tensor `name`; ValueError for one that is not a single finite value above 0."""
        if tensor.numel() != 1:
            raise ValueError(f"KV-cache scale {name} has {tensor.numel()} values: only per-tensor scales are "
                             "supported")
        value = float(tensor.float().item())
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"KV-cache scale {name} is {value}: a scale must be finite and above 0")
        kind = next(kind for suffix, kind in _SUFFIXES.items() if name.endswith(suffix))
        layer = int(_LAYER.search(name).group(1))  # type: ignore[union-attr]  (is_kv_scale checked it)
        self._found.setdefault(layer, {})[kind] = value

    def apply(self, layers: list[nn.Module]) -> None:
        """Set the `kv_scales` of each of a model's attention layers (runtime/native/models/attention.py's
        `attention_layers`: layer i is the i-th)."""
        for index, found in sorted(self._found.items()):
            if index >= len(layers):
                raise ValueError(f"KV-cache scales for layer {index}, but the model has {len(layers)} attention "
                                 "layers")
            k = found.get("k", found.get("kv"))
            v = found.get("v", found.get("kv"))
            layers[index].kv_scales = KvScales(k or v, v or k)  # type: ignore[arg-type]  (one of them is set)


def describe_kv_scales(layers: list[nn.Module]) -> str:
    """The start-up line about the scales of an FP8 cache over the attention `layers`."""
    scales: list[KvScales] = [layer.kv_scales for layer in layers]
    if all(s == UNIT for s in scales):
        return ("FP8 KV cache: the checkpoint has no K/V scales; scale 1 (keys and values beyond +-448 saturate, "
                "small ones lose precision)")
    ks, vs = [s.k for s in scales], [s.v for s in scales]
    return (f"FP8 KV cache: per-tensor scales from the checkpoint for {len(scales)} layers, K {min(ks):.4g}.."
            f"{max(ks):.4g}, V {min(vs):.4g}..{max(vs):.4g}")
