"""Tiny FP8 checkpoints written by our own code to each format's specification, with their dequantized float copies.

- compressed-tensors (the `compressed-tensors` package's QuantizationConfig as config.json's `quantization_config`):
  `weight` float8_e4m3fn, `weight_scale` [1] (strategy "tensor") or [out, 1] ("channel"), `input_scale` [1] for
  static activations; the output head listed in `ignore`.
- NVIDIA ModelOpt (`hf_quant_config.json`): `weight` float8_e4m3fn, `weight_scale` and `input_scale` scalars (quant_algo
  FP8: per tensor, static activations), or `weight_scale` [out] (FP8_PER_CHANNEL_PER_TOKEN: dynamic activations).
Every projection (q/k/v/o, gate/up/down, experts' too) is quantized; embeddings, norms, routers and the head are not.

KV-cache scales (one K and one V scale per layer, float32): compressed-tensors declares `kv_cache_scheme` (8-bit float,
per tensor, static) and stores `self_attn.k_scale` / `v_scale` [1] (older releases: `self_attn.k_proj.output_scale` /
`v_proj.output_scale`); ModelOpt declares `kv_cache_quant_algo: FP8` and stores scalars `self_attn.k_proj.k_scale` /
`self_attn.v_proj.v_scale`.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import load_file, save_file

Layout = Literal["compressed-tensors", "modelopt"]
PROJECTION = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.weight$")
E4M3_MAX = 448.0
INPUT_SCALE = 8.0 / E4M3_MAX  # a static activation scale: inputs up to 8 in magnitude, as a calibration might find


def to_e4m3(weight: torch.Tensor, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 values, float32 scale [out, 1] or [1]): each row's (or the tensor's) largest magnitude maps to 448."""
    w = weight.float()
    peak = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax().reshape(1)
    scale = peak / E4M3_MAX
    return (w / scale).to(torch.float8_e4m3fn), scale


KV_FACTOR = 256.0  # amplify_kv's: the tiny models' keys and values (up to about 5) then pass E4M3's 448


def kv_scales_for(layers: int) -> list[tuple[float, float]]:
    """(k_scale, v_scale) per layer for keys and values amplified by KV_FACTOR: below 448 once divided, on another
    E4M3 grid than scale 1's (not powers of two), and different in each layer."""
    return [(3.25 + 0.5 * i, 3.5 + 0.25 * i) for i in range(layers)]


def amplify_kv(source: Path, root: Path) -> Path:
    """A copy of the Llama checkpoint `source` whose keys and values are KV_FACTOR times larger and whose outputs are
    the same in exact arithmetic: k_proj and v_proj times KV_FACTOR, q_proj and o_proj divided by it (q . k and
    o_proj(v) unchanged; RoPE is linear)."""
    folder = root / f"{source.name}-kv-x{KV_FACTOR:g}"
    weights = load_file(str(source / "model.safetensors"))
    factors = {"k_proj": KV_FACTOR, "v_proj": KV_FACTOR, "q_proj": 1 / KV_FACTOR, "o_proj": 1 / KV_FACTOR}
    for key, tensor in weights.items():
        projection = key.split(".")[-2]
        if projection in factors:
            weights[key] = tensor * factors[projection]
    shutil.copytree(source, folder, dirs_exist_ok=True)
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def _kv_scale_tensors(layout: Layout, scales: list[tuple[float, float]], legacy_names: bool) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of per-layer (k_scale, v_scale) in `layout`'s names and shapes."""
    tensors = {}
    for i, (k, v) in enumerate(scales):
        attn = f"model.layers.{i}.self_attn"
        if layout == "modelopt":
            tensors[f"{attn}.k_proj.k_scale"], tensors[f"{attn}.v_proj.v_scale"] = torch.tensor(k), torch.tensor(v)
        elif legacy_names:
            tensors[f"{attn}.k_proj.output_scale"], tensors[f"{attn}.v_proj.output_scale"] = (torch.tensor([k]),
                                                                                            torch.tensor([v]))
        else:
            tensors[f"{attn}.k_scale"], tensors[f"{attn}.v_scale"] = torch.tensor([k]), torch.tensor([v])
    return tensors


def _config(layout: Layout, per_channel: bool, static: bool, kv_scales: bool, weights: bool) -> dict:
    if layout == "modelopt":
        return {"producer": {"name": "modelopt", "version": "0.19.0"},
                "quantization": {"quant_algo": "FP8" if not per_channel else "FP8_PER_CHANNEL_PER_TOKEN",
                                 "kv_cache_quant_algo": "FP8" if kv_scales else None, "exclude_modules": ["lm_head"]}}
    kv_scheme = ({"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}
                 if kv_scales else None)
    if not weights:
        return {"quant_method": "compressed-tensors", "format": "dense", "quantization_status": "compressed",
                "ignore": [], "kv_cache_scheme": kv_scheme, "config_groups": {}}
    inputs = ({"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False} if static
              else {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True})
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "kv_cache_scheme": kv_scheme,
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": inputs, "weights": {
                "num_bits": 8, "type": "float", "strategy": "channel" if per_channel else "tensor",
                "symmetric": True, "dynamic": False}}}}


def write_fp8_checkpoint(source: Path, root: Path, layout: Layout, *, per_channel: bool = True,
                         static: bool = False, kv_scales: list[tuple[float, float]] | None = None,
                         legacy_kv_names: bool = False, weights: bool = True) -> tuple[Path, Path]:
    """The checkpoint `source` (one safetensors file) quantized in `layout` under `root`, and the float32 checkpoint of
    its dequantized weights (the reference): (quantized folder, dequantized folder). `kv_scales`: (k_scale, v_scale)
    per layer to store as KV-cache scales (`legacy_kv_names`: compressed-tensors' older output_scale names);
    `weights` False: the projections stay 16-bit (a compressed-tensors checkpoint of KV-cache scales only)."""
    name = (f"{source.name}-{layout}-{'channel' if per_channel else 'tensor'}-{'static' if static else 'dynamic'}"
            f"{'-kv' if kv_scales else ''}{'-legacy' if legacy_kv_names else ''}{'' if weights else '-kv-only'}")
    quantized_dir, plain_dir = root / name, root / f"{name}-dequantized"
    tensors = load_file(str(source / "model.safetensors"))
    quantized, plain = {}, {}
    for key, tensor in tensors.items():
        if not weights or not PROJECTION.search(key):
            quantized[key] = plain[key] = tensor
            continue
        values, scale = to_e4m3(tensor, per_channel)
        module = key.removesuffix(".weight")
        quantized[key] = values
        # ModelOpt: a scalar per tensor, [out] per channel
        quantized[f"{module}.weight_scale"] = scale if layout == "compressed-tensors" else scale.reshape(
            -1 if per_channel else ())
        if static:
            quantized[f"{module}.input_scale"] = torch.tensor([INPUT_SCALE] if layout == "compressed-tensors" else
                                                              INPUT_SCALE)
        plain[key] = values.float() * scale
    quantized.update(_kv_scale_tensors(layout, kv_scales or [], legacy_kv_names))
    for folder, tensors in ((quantized_dir, quantized), (plain_dir, plain)):
        shutil.copytree(source, folder, dirs_exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    if layout == "compressed-tensors":
        config["quantization_config"] = _config(layout, per_channel, static, bool(kv_scales), weights)
    else:
        (quantized_dir / "hf_quant_config.json").write_text(json.dumps(_config(layout, per_channel, static,
                                                                               bool(kv_scales), weights)))
    (quantized_dir / "config.json").write_text(json.dumps(config))
    return quantized_dir, plain_dir
