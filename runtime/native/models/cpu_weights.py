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
  recovers the file's own 4-bit values, up to rounding the scales to bf16. AWQ and GPTQ checkpoints (groups of a
  multiple of 32 inputs, no act-order) keep their own 4-bit values: the loader hands over their grid. The output head of a tied
  embedding is often kept at 8 bits in GGUF files, so int4 quantizes the head to int8.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Quantization = Literal["none", "int8", "int4"]
INT4_GROUP = 32  # inputs sharing one scale and offset, as in GGUF's Q4_0/Q4_1 blocks
# rows up to which the quantized weights serve. int8: measured (RESULTS.md, 2026-11-26), where it still beats
# prepacked bf16; int4: every step, from the prompt's on (its kernel reads each weight once for all rows), so an int4
# model keeps no bf16 copy of its projections (RESULTS.md, 2026-11-28)
MAX_ROWS = {"int8": 4, "int4": sys.maxsize}


TILE = 16  # output rows side by side in the kernels' layouts (runtime/native/cpu/quantized_linear.cpp)


@dataclass(frozen=True)
class Int8Weight:
    """weight ~= q * scale[:, None], read by runtime/native/cpu/quantized_linear.cpp: q tiled [tiles, in, 16] (16 output
    rows of one input side by side, the last tile padded with zeros), scale [tiles * 16] in the activations' dtype."""

    tiled: torch.Tensor  # int8
    scale: torch.Tensor
    out_features: int

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.trtllm_gateway_cpu.int8_linear(x.contiguous(), self.tiled, self.scale, self.out_features)

    @property
    def qweight(self) -> torch.Tensor:
        """q as [out, in]."""
        tiles, inputs, _ = self.tiled.shape
        return self.tiled.permute(0, 2, 1).reshape(tiles * TILE, inputs)[: self.out_features]

    def dequantize(self) -> torch.Tensor:
        return (self.qweight.float() * self.scale[: self.out_features].float()[:, None]).to(self.scale.dtype)

    @property
    def nbytes(self) -> int:
        return self.tiled.numel() + self.scale.numel() * self.scale.element_size()


@dataclass(frozen=True)
class Int4Weight:
    """weight[o, i] ~= (q[o, i] - 8) * scale + offset of o's group of INT4_GROUP inputs, q in 0..15, read as it is
    stored by runtime/native/cpu/quantized_linear.cpp (its comment gives the layout): packed uint8 [tiles, in / 4, 32],
    scale and offset [tiles, in / 32, 16] in the activations' dtype, the last tile padded with zeros."""

    packed: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    out_features: int

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.trtllm_gateway_cpu.int4_linear(x.contiguous(), self.packed, self.scale, self.offset,
                                                         self.out_features)

    def dequantize(self) -> torch.Tensor:
        tiles, quads, _ = self.packed.shape
        nibbles = self.packed.view(tiles, quads, TILE, 2).long()
        q = torch.stack((nibbles & 15, nibbles >> 4), dim=3)  # [tile, quad, row, high, e]: input 4 quad + 2 high + e
        q = q.permute(0, 2, 1, 3, 4).reshape(tiles * TILE, quads * 4)

        def per_input(t: torch.Tensor) -> torch.Tensor:  # [tile, group, row] -> [out, in]
            return t.permute(0, 2, 1).reshape(tiles * TILE, -1).float().repeat_interleave(INT4_GROUP, dim=1)

        weight = (q - 8) * per_input(self.scale) + per_input(self.offset)
        return weight[: self.out_features].to(self.scale.dtype)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + 2 * self.scale.numel() * self.scale.element_size()


QuantizedWeight = Int8Weight | Int4Weight


def _padded(w: torch.Tensor) -> torch.Tensor:
    """`w` [out, ...] with zero rows up to a whole number of tiles."""
    return torch.nn.functional.pad(w, (0, 0) * (w.dim() - 1) + (0, -w.shape[0] % TILE))


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Symmetric per-output-channel int8 (the largest magnitude of each row maps to 127)."""
    w = _padded(weight.detach().float())
    # the scale as the kernel will read it (bf16 for a bf16 model), so rounding to it costs at most half a step
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12).to(weight.dtype)
    q = torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
    out, inputs = q.shape
    return Int8Weight(q.view(out // TILE, TILE, inputs).permute(0, 2, 1).contiguous(), scale, weight.shape[0])


def int4_fits(weight: torch.Tensor) -> bool:
    """The int4 kernel's shapes: inputs in whole groups."""
    return weight.shape[1] % INT4_GROUP == 0


def quantize_int4(weight: torch.Tensor, grid: tuple[torch.Tensor, torch.Tensor] | None = None) -> Int4Weight:
    """Asymmetric int4 per group of INT4_GROUP inputs: each group's minimum maps to 0, its maximum to 15; or, given
    the `grid` an INT4 checkpoint stored the weight on (scale and offset [out, in / INT4_GROUP], Linear.int4_grid),
    the stored 4-bit values themselves."""
    w = _padded(weight.detach().float())
    out, inputs = w.shape
    w = w.view(out, inputs // INT4_GROUP, INT4_GROUP)
    if grid is None:
        low, high = w.amin(dim=-1), w.amax(dim=-1)
        scale = ((high - low) / 15).clamp(min=1e-12)
        offset = low + 8 * scale  # the kernel computes (q - 8) * scale + offset
    else:
        scale, offset = _padded(grid[0].float()).clamp(min=1e-12), _padded(grid[1].float())
    q = torch.round((w - offset[..., None]) / scale[..., None] + 8).clamp(0, 15).to(torch.uint8).view(out, inputs)
    tiles = out // TILE
    q = q.view(tiles, TILE, inputs // 4, 2, 2).permute(0, 2, 1, 3, 4)  # [tile, quad, row, high, e]
    packed = (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).reshape(tiles, inputs // 4, 2 * TILE).contiguous()

    def tiled(t: torch.Tensor) -> torch.Tensor:  # [out, group] -> [tile, group, row]
        return t.view(tiles, TILE, -1).permute(0, 2, 1).to(weight.dtype).contiguous()

    return Int4Weight(packed, tiled(scale), tiled(offset), weight.shape[0])


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


def cpu_weight(weight: torch.Tensor, quantization: Quantization, head: bool = False,
               grid: tuple[torch.Tensor, torch.Tensor] | None = None) -> CpuWeight:
    """The CPU forms of `weight`. int4 serves every row count on its own, an output head (`head`) at int8 (see the
    module docstring), on an INT4 checkpoint's `grid` where it has one; int8 serves few rows beside prepacked bf16."""
    form = CpuWeight()
    if quantization == "int4" and (head or int4_fits(weight)):
        form.quantized = quantize_int8(weight) if head else quantize_int4(weight, grid)
        form.max_rows = MAX_ROWS["int4"]
        return form
    if can_prepack(weight):
        form.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)
    if quantization != "none":
        form.quantized, form.max_rows = quantize_int8(weight), MAX_ROWS["int8"]
    return form


def serves_alone(form: CpuWeight | None) -> bool:
    """Whether `form` serves every product, so that the plain weight is not needed."""
    return form is not None and form.quantized is not None and form.max_rows == sys.maxsize


def prepare_cpu_weights(model: nn.Module, quantization: Quantization) -> int:
    """Give every projection of `model`, and its output head, their CPU forms, and drop the plain weights of the
    projections that no longer need them; the bytes added less those dropped."""
    from runtime.native.models.base import CausalLM
    from runtime.native.models.linear import Linear

    added = 0
    head_module = getattr(model, "lm_head", None)
    # projections kept in INT4 (int4_checkpoint.keeps_int4) have no plain weight and run their own kernels
    linears = [m for m in model.modules() if isinstance(m, Linear) and m is not head_module and m.weight is not None]
    for linear in linears:
        form = cpu_weight(linear.weight, quantization, grid=linear.int4_grid)
        linear.int4_grid = None
        linear.cpu_weight = form if _bytes(form) else None  # nothing faster than F.linear (float32, no quantization)
        added += _bytes(form)
        if serves_alone(form):
            added -= linear.weight.numel() * linear.weight.element_size()
            linear.weight = nn.Parameter(linear.weight.new_empty((0, linear.in_features)), requires_grad=False)
    if isinstance(model, CausalLM):
        form = cpu_weight(model.output_embedding(), quantization, head=True)
        model.cpu_head = form if _bytes(form) else None
        added += _bytes(form)
    _return_freed_memory()
    return added


def prepare_plain_linears(module: nn.Module, quantization: Quantization) -> int:
    """prepare_cpu_weights for the torch nn.Linear layers of `module` (an EAGLE head's projections): each one's
    forward through its CPU forms (its weight kept: forms that serve a few rows fall back to it); the bytes added."""
    added = 0
    for linear in module.modules():
        if type(linear) is nn.Linear:
            form = cpu_weight(linear.weight, quantization)
            if _bytes(form):
                linear.forward = functools.partial(_plain_linear, form, linear)  # type: ignore[method-assign]
                added += _bytes(form)
    return added


def _plain_linear(form: CpuWeight, linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, linear.in_features)
    return form.linear(rows, linear.weight, linear.bias).reshape(*x.shape[:-1], linear.out_features)


def _return_freed_memory() -> None:
    """Give the dropped weights' pages back to the OS: glibc keeps freed blocks of this size in its heap once its
    mmap threshold has grown (80 MB of the default model's engine stayed resident without this)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator decides
        pass


def _bytes(form: CpuWeight) -> int:
    packed = 0 if form.packed is None else form.packed.numel() * form.packed.element_size()
    return packed + (0 if form.quantized is None else form.quantized.nbytes)
