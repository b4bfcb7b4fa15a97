"""Faster forms of the projection weights on CPU: oneDNN-prepacked bf16, and int8 or int4 weight-only copies.

Why: a decode step multiplies every weight by a handful of rows, so it is bound by how fast the weights
stream from memory, and `F.linear` on a plain [out, in] bf16 weight lets oneDNN reorder it on each call.
Measured on the 2-core dev box (SmolLM2-135M's 121 projections plus its output head, weights streamed from
DRAM as in a real step, RESULTS.md 2026-11-26), milliseconds of matrix products per decode step:

| rows | threads | bf16 `F.linear` | bf16 prepacked | int8 | int4 |
|---|---|---|---|---|---|
| 1 | 1 | 49 | 35 | 25 | 12 |
| 1 | 2 | 27 | 20 | 14 | 6 |
| 16 | 2 | 29 | 23 | 53 | 32 |

- Prepacked bf16 (`torch.ops.mkldnn`, the layout inductor's freezing pass uses) gives the same values as
  `F.linear` and is faster at every batch size, so every bf16 model on CPU gets it.
- Weight-only int8 (per output channel) and int4 (groups of 32 inputs with a scale and an offset, the layout
  of GGUF's Q4_1) read 2x and 4x fewer bytes but dequantize as they go, which loses from a few rows on
  (AMX multiplies bf16 batches almost for free). They serve steps of up to `max_rows` rows and the
  prepacked bf16 weight serves the rest (prefills, busy decode steps). A request's greedy tokens may then
  depend on how many others decode beside it: the quantized and bf16 products round apart.
- int4 requantizes each weight; for a checkpoint that was Q4_1 (the default model's projections) that
  recovers the file's own 4-bit values, up to rounding the scales to bf16. The output head of a tied
  embedding is often kept at 8 bits in GGUF files, so int4 quantizes the head to int8.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Quantization = Literal["none", "int8", "int4"]
INT4_GROUP = 32  # inputs sharing one scale and offset, as in GGUF's Q4_0/Q4_1 blocks
MAX_ROWS = {"int8": 4, "int4": 8}  # measured (RESULTS.md, 2026-11-26): where each still beats prepacked bf16


@dataclass(frozen=True)
class Int8Weight:
    """weight ~= qweight * scale[:, None]; scale in the activations' dtype, as the kernel takes it."""

    qweight: torch.Tensor  # int8 [out, in]
    scale: torch.Tensor  # [out]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x.contiguous(), self.qweight, self.scale)

    def dequantize(self) -> torch.Tensor:
        return (self.qweight.float() * self.scale.float()[:, None]).to(self.scale.dtype)

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + self.scale.numel() * self.scale.element_size()


@dataclass(frozen=True)
class Int4Weight:
    """weight[o, i] ~= (q[o, i] - 8) * scale[g, o] + offset[g, o] with g = i // INT4_GROUP, q in 0..15."""

    packed: torch.Tensor  # uint8, ATen's CPU int4 layout of q
    scale_offset: torch.Tensor  # [in / INT4_GROUP, out, 2] in the activations' dtype
    shape: tuple[int, int]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), self.packed, INT4_GROUP, self.scale_offset)

    def dequantize(self) -> torch.Tensor:
        out, inputs = self.shape
        q = self.matmul(torch.eye(inputs, dtype=self.scale_offset.dtype)).t()  # the kernel's own unpacking
        return q.reshape(out, inputs)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scale_offset.numel() * self.scale_offset.element_size()


QuantizedWeight = Int8Weight | Int4Weight


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Symmetric per-output-channel int8 (the largest magnitude of each row maps to 127)."""
    w = weight.detach().float()
    # the scale as the kernel will read it (bf16 for a bf16 model), so rounding to it costs at most half a step
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12).to(weight.dtype)
    qweight = torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Weight(qweight.contiguous(), scale)


def int4_fits(weight: torch.Tensor) -> bool:
    """ATen's int4 packing needs whole groups along the input and outputs in multiples of 16."""
    out, inputs = weight.shape
    return inputs % INT4_GROUP == 0 and out % 16 == 0


def quantize_int4(weight: torch.Tensor) -> Int4Weight:
    """Asymmetric int4 per group of INT4_GROUP inputs: each group's minimum maps to 0, its maximum to 15."""
    out, inputs = weight.shape
    w = weight.detach().float().view(out, inputs // INT4_GROUP, INT4_GROUP)
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scale = ((high - low) / 15).clamp(min=1e-12)
    q = torch.round((w - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32).view(out, inputs)
    offset = low + 8 * scale  # the kernel computes (q - 8) * scale + offset
    scale_offset = torch.stack((scale.t(), offset.t()), dim=-1).to(weight.dtype).contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    return Int4Weight(packed, scale_offset, (out, inputs))


@dataclass
class CpuWeight:
    """The forms of one [out, in] weight that a CPU product picks from by the number of rows."""

    packed: torch.Tensor | None = None  # oneDNN's blocked bf16 layout of the weight
    quantized: QuantizedWeight | None = None
    max_rows: int = 0  # rows up to which `quantized` serves

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.quantized is not None and x.shape[0] <= self.max_rows:
            y = self.quantized.matmul(x)
            return y if bias is None else y + bias
        if self.packed is not None and not torch.compiler.is_compiling():
            # (not in a compiled step: inductor's lowering of this op takes only weights it packed itself)
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [None], "")
        return F.linear(x, weight, bias)


def can_prepack(weight: torch.Tensor) -> bool:
    """oneDNN's bf16 products (AMX or AVX-512 BF16) on this CPU; float32 prepacking gains nothing here."""
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()


def cpu_weight(weight: torch.Tensor, quantization: Quantization, head: bool = False) -> CpuWeight:
    """The CPU forms of `weight`; an output head (`head`) takes int8 where int4 is asked for."""
    form = CpuWeight()
    if can_prepack(weight):
        form.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)
    if quantization == "int4" and not head and int4_fits(weight):
        form.quantized, form.max_rows = quantize_int4(weight), MAX_ROWS["int4"]
    elif quantization != "none":
        form.quantized, form.max_rows = quantize_int8(weight), MAX_ROWS["int8"]
    return form


def prepare_cpu_weights(model: nn.Module, quantization: Quantization) -> int:
    """Give every Linear of `model`, and its output head, their CPU forms; the bytes those take."""
    from runtime.native.models.base import CausalLM
    from runtime.native.models.linear import Linear

    added = 0
    for linear in [m for m in model.modules() if isinstance(m, Linear)]:
        form = cpu_weight(linear.weight, quantization)
        linear.cpu_weight = form if _bytes(form) else None  # nothing faster than F.linear (float32, no quantization)
        added += _bytes(form)
    if isinstance(model, CausalLM):
        form = cpu_weight(model.output_embedding(), quantization, head=True)
        model.cpu_head = form if _bytes(form) else None
        added += _bytes(form)
    return added


def _bytes(form: CpuWeight) -> int:
    packed = 0 if form.packed is None else form.packed.numel() * form.packed.element_size()
    return packed + (0 if form.quantized is None else form.quantized.nbytes)
