"""Loading FP8 checkpoints (compressed-tensors, NVIDIA ModelOpt) and quantizing 16-bit ones at load (--quantization fp8).

Both formats store each quantized projection as `<module>.weight` (float8_e4m3fn [out, in]) with `<module>.weight_scale`
(float32: one value per tensor, or [out, 1] per channel) and, for static activation scales, `<module>.input_scale`
(one value); W = weight * weight_scale. What a checkpoint declares:
- compressed-tensors: config.json `quantization_config` {"quant_method": "compressed-tensors", "config_groups": {name:
  {"weights": {"num_bits": 8, "type": "float", "strategy": "tensor" | "channel"}, "input_activations": null or
  {"num_bits": 8, "type": "float", "strategy": "token" (dynamic) | "tensor" (static)}}}, "ignore": [...]};
- ModelOpt: `hf_quant_config.json` {"quantization": {"quant_algo": "FP8" (or "FP8_PER_CHANNEL_PER_TOKEN"),
  "exclude_modules": [...]}}, or the same keys flat in config.json's `quantization_config` ("quant_method": "modelopt").
Which projections are FP8 is read from the tensors themselves (their dtype in the safetensors headers), so ignore and
exclude lists need no matching against our module names. KV-cache scales (`k_scale`, `v_scale`, ...) go to the
attention layers, for an FP8 KV cache (runtime/native/models/kv_scales.py).

With FP8 tensor cores (runtime/native/models/fp8.py's `native_fp8`), every Linear whose parts are all FP8 in the file keeps
them (the output head excepted: logits stay 16-bit); other FP8 tensors (experts, the head) and every FP8 tensor on
a device without FP8 tensor cores are dequantized as they are read, with one log line saying so.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from runtime.fp8_config import QUANT_METHODS, check_modelopt, check_quantization_config
from runtime.native.models.attention import attention_layers
from runtime.native.models.base import CausalLM
from runtime.native.models.fp8 import FP8, dequantize, native_fp8, quantize_rows
from runtime.native.models.kv_scales import KvScaleReader, is_kv_scale
from runtime.native.models.linear import Linear
from runtime.native.models.moe import MoE

logger = logging.getLogger(__name__)

_SCALES = (".weight_scale", ".input_scale")


def checkpoint_is_fp8(folder: Path, config: dict[str, Any]) -> bool:
    """Whether the checkpoint declares FP8 weights (and which it is, checked); ValueError for an unsupported scheme."""
    quantization = config.get("quantization_config")
    if quantization:
        if quantization.get("quant_method") not in QUANT_METHODS:
            return False  # the registry refuses it
        check_quantization_config(quantization)
        return True
    modelopt = folder / "hf_quant_config.json"
    if modelopt.exists():
        check_modelopt(json.loads(modelopt.read_text()).get("quantization") or {})
        return True
    return False


class Fp8Reader:
    """Pairs each FP8 weight of a checkpoint with its scales as the loader reads them (in any order): what it
    returns goes into the model as usual, either the FP8 tensors of a Linear in FP8 form or the dequantized weight."""

    def __init__(self, model: CausalLM, files: list[Path], device: torch.device) -> None:
        self.model = model
        self.dtype = model.output_embedding().dtype
        fp8_weights: set[str] = set()  # checkpoint names of FP8 weights
        self.static_inputs: set[str] = set()  # their modules with an input_scale
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    if name.endswith(".weight") and f.get_slice(name).get_dtype() == "F8_E4M3":
                        fp8_weights.add(name)
                    elif name.endswith(".input_scale"):
                        self.static_inputs.add(name.removesuffix(".input_scale"))
        self.kept = self._keep_fp8(fp8_weights) if native_fp8(device) else set()
        self.fp8_modules = {name.removesuffix(".weight") for name in fp8_weights}
        self.dequantized = 0
        self._held: dict[str, dict[str, torch.Tensor]] = {}
        self.kv_scales = KvScaleReader()

    def _keep_fp8(self, fp8_weights: set[str]) -> set[str]:
        """Our Linears whose every part is FP8 in the file, turned into FP8 form; their module names."""
        parts: dict[str, set[str | None]] = {}
        static: set[str] = set()
        for name in fp8_weights:
            module = self._linear_of(name)
            if module is not None:
                parts.setdefault(module, set()).add(self.model.checkpoint_target(name)[1])  # type: ignore[index]
                if name.removesuffix(".weight") in self.static_inputs:
                    static.add(module)
        head = self.model.output_embedding()
        kept = set()
        for module_name, found in parts.items():
            linear = self.model.get_submodule(module_name)
            if linear.weight is not head and found in ({None}, set(linear.part_names)):
                to_fp8_form(linear, static=module_name in static)
                kept.add(module_name)
        return kept

    def _linear_of(self, weight_name: str) -> str | None:
        """The name of our Linear that the checkpoint weight `weight_name` goes into; None for other modules."""
        target = self.model.checkpoint_target(weight_name)
        if target is None or not target[0].endswith(".weight"):
            return None
        module = target[0].removesuffix(".weight")
        try:
            return module if isinstance(self.model.get_submodule(module), Linear) else None
        except AttributeError:  # a parameter of another module (stacked experts)
            return None

    def takes(self, name: str) -> bool:
        """Whether `name` goes through `accept` (an FP8 weight, its scales, a KV-cache scale)."""
        return is_kv_scale(name) or name.removesuffix(".weight") in self.fp8_modules or any(
            name.endswith(suffix) and name.removesuffix(suffix) in self.fp8_modules for suffix in _SCALES)

    def accept(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The (checkpoint name, tensor) pairs ready to load once `name` is read: none until a weight's scales are."""
        if is_kv_scale(name):
            self.kv_scales.add(name, tensor)
            return []
        module, _, kind = name.rpartition(".")
        held = self._held.setdefault(module, {})
        held[kind] = tensor
        if "weight" not in held or "weight_scale" not in held or (
                module in self.static_inputs and "input_scale" not in held):
            return []
        del self._held[module]
        weight, scale = held["weight"], held["weight_scale"].float().reshape(-1)
        rows = weight.shape[0]
        if scale.numel() not in (1, rows):
            raise ValueError(f"{module}.weight_scale has {scale.numel()} values for {rows} rows: only per-tensor "
                             "and per-channel FP8 scales are supported")
        if self._linear_of(f"{module}.weight") in self.kept:
            ready = [(f"{module}.weight", weight), (f"{module}.weight_scale", scale.expand(rows).contiguous())]
            if "input_scale" in held:  # one per part: repeated over its rows, their largest taken after loading
                ready.append((f"{module}.input_scale", held["input_scale"].float().reshape(1).expand(rows)))
            return ready
        self.dequantized += 1
        return [(f"{module}.weight", dequantize(weight, scale, self.dtype))]

    def finish(self) -> None:
        """After the last tensor: static activation scales to one per Linear, and the log line."""
        if self._held:
            raise ValueError(f"FP8 weights without their scales in the checkpoint: {', '.join(sorted(self._held))}")
        self.kv_scales.apply(attention_layers(self.model))
        for module in self.kept:
            linear = self.model.get_submodule(module)
            if linear.input_scale is not None:  # fused parts' scales: the largest, so no part's activations clip
                linear.input_scale = nn.Parameter(linear.input_scale.data.amax().reshape(1), requires_grad=False)
        if self.kept:
            logger.info("FP8 checkpoint: %d projections kept in FP8 (FP8 tensor cores)%s", len(self.kept),
                        f", {self.dequantized} FP8 tensors dequantized to {self.dtype}" if self.dequantized else "")
        elif self.fp8_modules:
            logger.info("FP8 checkpoint: no FP8 tensor cores on this device (CUDA compute capability 8.9+), "
                        "%d FP8 tensors dequantized to %s at load", self.dequantized, self.dtype)


def to_fp8_form(linear: Linear, static: bool = False) -> None:
    """Give `linear` empty FP8 weights and scales in place of its 16-bit weight (the loader fills them)."""
    out, device = linear.out_features, linear.weight.device
    linear.weight = nn.Parameter(torch.empty(out, linear.in_features, dtype=FP8, device=device), requires_grad=False)
    linear.weight_scale = nn.Parameter(torch.empty(out, dtype=torch.float32, device=device), requires_grad=False)
    if static:
        linear.input_scale = nn.Parameter(torch.empty(out, dtype=torch.float32, device=device), requires_grad=False)


def quantize_model(model: CausalLM) -> None:
    """--quantization fp8: every 16-bit Linear but the output head and MoE routers (a few KB that pick the experts)
    to FP8 with per-channel scales; experts stay 16-bit. Without FP8 tensor cores the FP8 values are dequantized back
    (the served weights are the FP8 ones, in the served dtype)."""
    head = model.output_embedding()
    routers = {id(m.gate) for m in model.modules() if isinstance(m, MoE)}
    linears = [m for m in model.modules() if isinstance(m, Linear) and m.weight is not head and id(m) not in routers]
    native = native_fp8(head.device)
    for linear in linears:
        q, scale = quantize_rows(linear.weight)
        if native:
            linear.weight = nn.Parameter(q, requires_grad=False)
            linear.weight_scale = nn.Parameter(scale, requires_grad=False)
        else:
            linear.weight.data.copy_(dequantize(q, scale, linear.weight.dtype))
    logger.info("--quantization fp8: %d projections quantized to FP8 per channel%s", len(linears),
                "" if native else f", dequantized to {head.dtype} (no FP8 tensor cores on this device)")
