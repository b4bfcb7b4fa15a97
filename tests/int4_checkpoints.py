"""Tiny INT4 weight-only checkpoints written by our own code to each format's specification (the layouts are described
in runtime/native/models/int4_checkpoint.py), with their dequantized float copies.

Weights are quantized calibration-free, round to nearest (int4_checkpoint.quantize_rtn; AWQ: asymmetric, GPTQ:
symmetric, its zero point 8 written minus one as the classic format stores it). With act-order (`desc_act`) GPTQ groups input rows in a shuffled order, named by `g_idx`.
Packing is written here with plain loops over nibbles, independently of the engine's unpacking.
Every projection (q/k/v/o, gate/up/down) is quantized; embeddings, norms and the head are not.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import load_file, save_file

from runtime.native.models.int4_checkpoint import quantize_rtn
from tests.fp8_checkpoints import PROJECTION

Layout = Literal["awq", "gptq", "gptq-desc-act"]
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's gemm pack: nibble i <- column AWQ_PACK_ORDER[i] of each 8


def pack(values: torch.Tensor, dim: int, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """int32 0..15 values packed 8 to an int32 along `dim`: nibble i of each holds position order[i] of its 8."""
    moved = values.movedim(dim, -1)
    out = torch.zeros(*moved.shape[:-1], moved.shape[-1] // 8, dtype=torch.int64)
    for start in range(0, moved.shape[-1], 8):
        for i, position in enumerate(order):
            out[..., start // 8] |= moved[..., start + position].long() << (4 * i)
    return _to_int32(out).movedim(-1, dim).contiguous()


def _to_int32(values: torch.Tensor) -> torch.Tensor:
    """uint32 bit patterns held in int64 as the int32 with the same bits."""
    return torch.where(values >= 2**31, values - 2**32, values).to(torch.int32)


def _quantize(weight: torch.Tensor, layout: Layout, group: int, generator: torch.Generator
              ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The packed tensors of one projection and its dequantized float32 weight [out, in]."""
    in_features = weight.shape[1]
    order = torch.randperm(in_features, generator=generator) if layout == "gptq-desc-act" else torch.arange(
        in_features)
    groups = torch.empty(in_features, dtype=torch.int64)
    groups[order] = torch.arange(in_features) // group
    count = in_features // group
    q, zeros, scales = quantize_rtn(weight, groups, count, symmetric=layout != "awq")
    dequantized = ((q - zeros[groups]).float() * scales.float()[groups]).t().contiguous()
    if layout == "awq":
        return {"qweight": pack(q, 1, AWQ_PACK_ORDER), "qzeros": pack(zeros, 1, AWQ_PACK_ORDER),
                "scales": scales}, dequantized
    return {"qweight": pack(q, 0), "qzeros": pack(zeros - 1, 1),
            "scales": scales, "g_idx": groups.int()}, dequantized


def quantization_config(layout: Layout, group: int) -> dict:
    if layout == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    return {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": layout == "gptq-desc-act",
            "sym": True, "true_sequential": True, "checkpoint_format": "gptq"}


def write_int4_checkpoint(source: Path, root: Path, layout: Layout, group: int = 32) -> tuple[Path, Path]:
    """The checkpoint `source` (one safetensors file) quantized in `layout` under `root`, and the float32 checkpoint of
    its dequantized weights (the reference): (quantized folder, dequantized folder)."""
    name = f"{source.name}-{layout}-g{group}"
    quantized_dir, plain_dir = root / name, root / f"{name}-dequantized"
    generator = torch.Generator().manual_seed(0)
    quantized, plain = {}, {}
    for key, tensor in load_file(str(source / "model.safetensors")).items():
        if not PROJECTION.search(key):
            quantized[key] = plain[key] = tensor
            continue
        packed, plain[key] = _quantize(tensor, layout, group, generator)
        module = key.removesuffix(".weight")
        quantized.update({f"{module}.{part}": value for part, value in packed.items()})
    for folder, tensors in ((quantized_dir, quantized), (plain_dir, plain)):
        shutil.copytree(source, folder, dirs_exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quantization_config(layout, group)
    (quantized_dir / "config.json").write_text(json.dumps(config))
    return quantized_dir, plain_dir
