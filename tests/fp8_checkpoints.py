"""Tiny FP8 checkpoints written by our own code to each format's specification, with their dequantized float copies.

- compressed-tensors (the `compressed-tensors` package's QuantizationConfig as config.json's `quantization_config`):
  `weight` float8_e4m3fn, `weight_scale` [1] (strategy "tensor") or [out, 1] ("channel"), `input_scale` [1] for
  static activations; the output head listed in `ignore`.
- NVIDIA ModelOpt (`hf_quant_config.json`): `weight` float8_e4m3fn, `weight_scale` and `input_scale` scalars (quant_algo
  FP8: per tensor, static activations), or `weight_scale` [out] (FP8_PER_CHANNEL_PER_TOKEN: dynamic activations).
Every projection (q/k/v/o, gate/up/down, experts' too) is quantized; embeddings, norms, routers and the head are not.
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


def _config(layout: Layout, per_channel: bool, static: bool) -> dict:
    if layout == "modelopt":
        return {"producer": {"name": "modelopt", "version": "0.19.0"},
                "quantization": {"quant_algo": "FP8" if not per_channel else "FP8_PER_CHANNEL_PER_TOKEN",
                                 "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}}
    inputs = ({"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False} if static
              else {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True})
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "kv_cache_scheme": None,
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": inputs, "weights": {
                "num_bits": 8, "type": "float", "strategy": "channel" if per_channel else "tensor",
                "symmetric": True, "dynamic": False}}}}


def write_fp8_checkpoint(source: Path, root: Path, layout: Layout, *, per_channel: bool = True,
                         static: bool = False) -> tuple[Path, Path]:
    """The checkpoint `source` (one safetensors file) quantized in `layout` under `root`, and the float32 checkpoint of
    its dequantized weights (the reference): (quantized folder, dequantized folder)."""
    name = f"{source.name}-{layout}-{'channel' if per_channel else 'tensor'}-{'static' if static else 'dynamic'}"
    quantized_dir, plain_dir = root / name, root / f"{name}-dequantized"
    weights = load_file(str(source / "model.safetensors"))
    quantized, plain = {}, {}
    for key, tensor in weights.items():
        if not PROJECTION.search(key):
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
    for folder, tensors in ((quantized_dir, quantized), (plain_dir, plain)):
        shutil.copytree(source, folder, dirs_exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    if layout == "compressed-tensors":
        config["quantization_config"] = _config(layout, per_channel, static)
    else:
        (quantized_dir / "hf_quant_config.json").write_text(json.dumps(_config(layout, per_channel, static)))
    (quantized_dir / "config.json").write_text(json.dumps(config))
    return quantized_dir, plain_dir
