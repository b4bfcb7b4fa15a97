"""Loading INT4 weight-only checkpoints: AWQ (GEMM layout) and GPTQ, declared by config.json's `quantization_config`.

Each quantized projection stores, in place of `<module>.weight` ([out, in] float):
- AWQ (AutoAWQ, `version: "gemm"`): `qweight` int32 [in, out/8], each int32 holding 8 output columns' 4-bit values,
  column 8j + AWQ_ORDER[i] in bits 4i..4i+3; `qzeros` int32 [in/group, out/8] packed the same way; `scales` float16
  [in/group, out]. W[k, n] = (q[k, n] - z[k // group, n]) * s[k // group, n].
- GPTQ (AutoGPTQ / GPTQModel): `qweight` int32 [in/8, out], input row 8i + j in bits 4j of row i; `qzeros` int32
  [groups, out/8], output column 8j + i in bits 4i; `scales` float16 [groups, out]; `g_idx` int32 [in], the group of each
  input row (k // group without act-order; any order with `desc_act: true`). The classic format
  (`checkpoint_format: "gptq"`, the default) stores each zero point minus one: W = (q - (z + 1)) * s[g_idx];
  `gptq_v2` stores it as it is.
The reference dequantization here is exact in float32 (a 4-bit integer times a float16 scale). On CUDA, every Linear
whose parts are all INT4 in the file is kept packed, repacked to runtime/native/cuda/int4.py's layout (its kernels
dequantize in registers); act-order checkpoints, MoE experts and every INT4 weight on the CPU are dequantized as they
are read. One log line says which.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from runtime.int4_config import INT4_METHODS, check_int4_config, group_size
from runtime.native.models.base import CausalLM
from runtime.native.models.linear import Linear

logger = logging.getLogger(__name__)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's interleave: nibble i of an int32 holds column AWQ_ORDER[i]
_PARTS = ("qweight", "qzeros", "scales", "g_idx")


def int4_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """The checked AWQ/GPTQ `quantization_config`, or None for other checkpoints; ValueError for an unsupported one."""
    quantization = config.get("quantization_config") or {}
    if quantization.get("quant_method") not in INT4_METHODS:
        return None
    check_int4_config(quantization)
    return quantization


def unpack_int4(packed: torch.Tensor, dim: int, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """int32 values holding eight 4-bit values each, unpacked along `dim` (8x longer) as int32 in 0..15; `order[i]`:
    which of the 8 positions nibble i (bits 4i..4i+3) holds."""
    shifts = torch.tensor([4 * order.index(position) for position in range(8)], dtype=torch.int32)
    moved = packed.movedim(dim, -1)
    values = (moved.unsqueeze(-1) >> shifts) & 0xF  # [..., packed, 8]: position p at [..., p]
    return values.reshape(*moved.shape[:-1], -1).movedim(-1, dim)


def unpack_awq(qweight: torch.Tensor, qzeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """AWQ GEMM tensors unpacked: (q int32 [in, out], zero points int32 [groups, out])."""
    return unpack_int4(qweight, 1, AWQ_ORDER), unpack_int4(qzeros, 1, AWQ_ORDER)


def unpack_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, v2: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ tensors unpacked: (q int32 [in, out], true zero points int32 [groups, out]; the classic format's are
    stored minus one)."""
    return unpack_int4(qweight, 0), unpack_int4(qzeros, 1) + (0 if v2 else 1)


def quantize_rtn(weight: torch.Tensor, groups: torch.Tensor, count: int, symmetric: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Calibration-free round-to-nearest INT4 of `weight` [out, in], input row k in group groups[k] of `count`: (q int32
    [in, out] in 0..15, zero points int32 [count, out], scales float16 [count, out]). Asymmetric (AWQ's way): each
    group's min..max (stretched to hold 0) onto 0..15; symmetric (GPTQ's sym): zero point 8, scale max |w| / 7.5."""
    w = weight.float().t()
    q = torch.empty_like(w, dtype=torch.int32)
    zeros = torch.empty(count, w.shape[1], dtype=torch.int32)
    scales = torch.empty(count, w.shape[1], dtype=torch.float16)
    for g in range(count):
        rows = w[groups == g]
        if symmetric:
            scale, zero = (rows.abs().amax(0) / 7.5).clamp(min=1e-5), torch.full((w.shape[1],), 8.0)
        else:
            low, high = rows.amin(0).clamp(max=0), rows.amax(0).clamp(min=0)
            scale = ((high - low) / 15).clamp(min=1e-5)
            zero = (-low / scale).round().clamp(0, 15)
        scales[g] = scale.half()
        zeros[g] = zero.int()
        q[groups == g] = (rows / scales[g].float() + zero).round().clamp(0, 15).int()
    return q, zeros, scales


def dequantize(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """The float32 weight [out, in] of unpacked values q [in, out], input row k in group groups[k]."""
    rows = groups.long()
    return ((q - zeros[rows]).float() * scales.float()[rows]).t().contiguous()


def dequantize_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """AWQ GEMM tensors to the float32 weight [out, in]."""
    q, zeros = unpack_awq(qweight, qzeros)
    return dequantize(q, zeros, scales, torch.arange(q.shape[0]) // (q.shape[0] // scales.shape[0]))


def dequantize_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
                    v2: bool = False) -> torch.Tensor:
    """GPTQ tensors to the float32 weight [out, in]."""
    return dequantize(*unpack_gptq(qweight, qzeros, v2), scales, g_idx)


def kernel_layout(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qweight, qzeros, qscales) in runtime/native/cuda/int4.py's output-major layout from unpacked values: q [in, out]
    in 0..15, zero points and scales [groups, out], groups of in / groups contiguous input rows."""
    nibbles = q.t().to(torch.int64).reshape(q.shape[1], -1, 8)
    packed = (nibbles << (4 * torch.arange(8))).sum(-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # the uint32 bits as int32
    return packed.contiguous(), zeros.t().to(torch.uint8).contiguous(), scales.t().to(dtype).contiguous()


def to_int4_form(linear: Linear, groups: int) -> None:
    """Give `linear` empty INT4 tensors in place of its 16-bit weight (the loader fills them)."""
    out, device = linear.out_features, linear.weight.device
    dtype = linear.weight.dtype
    linear.weight = None  # type: ignore[assignment]
    linear.qweight = nn.Parameter(torch.empty(out, linear.in_features // 8, dtype=torch.int32, device=device),
                                  requires_grad=False)
    linear.qzeros = nn.Parameter(torch.empty(out, groups, dtype=torch.uint8, device=device), requires_grad=False)
    linear.qscales = nn.Parameter(torch.empty(out, groups, dtype=dtype, device=device), requires_grad=False)


def tile_int4(linear: Linear) -> None:
    """Repack `linear`'s loaded INT4 tensors (to_int4_form's, filled) into the kernels' tile-major layout."""
    from runtime.native.cuda.int4 import tile_major  # Triton: only where INT4 weights are kept

    for name, tensor in zip(("qweight", "qzeros", "qscales"), tile_major(linear.qweight, linear.qzeros,
                                                                         linear.qscales)):
        setattr(linear, name, nn.Parameter(tensor, requires_grad=False))


def kernel_group(group: int) -> bool:
    """Whether runtime/native/cuda/int4.py's kernels take groups of `group` input columns (else: dequantized)."""
    return group >= 16 and group & (group - 1) == 0  # the GEMM's K tiles: powers of 2 within one group


def keeps_int4(device: torch.device) -> bool:
    """Whether INT4 weights stay packed for the Triton kernels (CUDA) rather than dequantized at load."""
    return device.type == "cuda"


class Int4Reader:
    """Collects each INT4 projection's packed tensors as the loader reads them (in any order) and hands back, once all
    are read, its tensors in the kernels' layout (a Linear kept in INT4 form) or its dequantized `<module>.weight`."""

    def __init__(self, model: CausalLM, config: dict[str, Any], files: list[Path], device: torch.device,
                 packed: bool = False) -> None:
        self.model = model
        self.method = config["quant_method"]
        self.config = config
        self.v2 = config.get("checkpoint_format") == "gptq_v2"
        self.dtype = model.output_embedding().dtype
        self.needed = ("qweight", "qzeros", "scales") + (("g_idx",) if self.method == "gptq" else ())
        # act-order's input rows out of group order: one permutation per checkpoint projection, which fused parts
        # need not share, so those weights are dequantized
        # (`packed`: --int4-kernels)
        self.kept = self._keep_int4(files) if packed and keeps_int4(device) and not config.get("desc_act") else set()
        self.dequantized = 0
        self._held: dict[str, dict[str, torch.Tensor]] = {}
        # the dequantized projections' 4-bit grids, by our Linear and its part: what --cpu-quantization int4 reads
        # to take the stored values as they are (cpu_weights.quantize_int4) rather than quantize them again
        self._grids: dict[str, dict[str | None, tuple[torch.Tensor, torch.Tensor]]] = {}

    def _keep_int4(self, files: list[Path]) -> set[str]:
        """Our Linears whose every part is INT4 in the file, turned into INT4 form; their module names."""
        parts: dict[str, set[str | None]] = {}
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    target = self.model.checkpoint_target(name) if name.endswith(".qweight") else None
                    if target is not None:
                        parts.setdefault(target[0].removesuffix(".qweight"), set()).add(target[1])
        kept = set()
        for module_name, found in parts.items():
            linear = self._module(module_name)
            if linear is None:  # a part of another module (stacked experts): dequantized
                continue
            group = group_size(self.config, linear.in_features) if isinstance(linear, Linear) else 0
            if isinstance(linear, Linear) and found in ({None}, set(linear.part_names)) and kernel_group(group):
                to_int4_form(linear, linear.in_features // group)
                kept.add(module_name)
        return kept

    def takes(self, name: str) -> bool:
        """Whether `name` is a packed INT4 tensor (through `accept`)."""
        return name.rpartition(".")[2] in _PARTS

    def accept(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The (checkpoint name, tensor) pairs ready to load once a projection's packed tensors are all read."""
        module, _, kind = name.rpartition(".")
        held = self._held.setdefault(module, {})
        held[kind] = tensor
        if any(part not in held for part in self.needed):
            return []
        del self._held[module]
        scales = held["scales"]
        if self.method == "awq":
            q, zeros = unpack_awq(held["qweight"], held["qzeros"])
            groups = torch.arange(q.shape[0]) // group_size(self.config, q.shape[0])
        else:
            q, zeros = unpack_gptq(held["qweight"], held["qzeros"], self.v2)
            groups = held["g_idx"].long()
        if groups.max() >= scales.shape[0]:
            raise ValueError(f"{module}: {scales.shape[0]} scale groups for {q.shape[0]} inputs in groups of "
                             f"{group_size(self.config, q.shape[0])}")
        target = self.model.checkpoint_target(f"{module}.qweight")
        if target is not None and target[0].removesuffix(".qweight") in self.kept:
            if not torch.equal(groups, torch.arange(q.shape[0]) // (q.shape[0] // scales.shape[0])):
                raise ValueError(f"{module}.g_idx is out of group order but desc_act is false")
            qweight, qzeros, qscales = kernel_layout(q, zeros, scales, self.dtype)
            return [(f"{module}.qweight", qweight), (f"{module}.qzeros", qzeros), (f"{module}.qscales", qscales)]
        self.dequantized += 1
        self._keep_grid(module, q.shape[0], zeros, scales, groups)
        return [(f"{module}.weight", dequantize(q, zeros, scales, groups).to(self.dtype))]

    def _keep_grid(self, module: str, inputs: int, zeros: torch.Tensor, scales: torch.Tensor,
                   groups: torch.Tensor) -> None:
        """Remember a dequantized projection's grid on the CPU's int4 groups (cpu_weights.INT4_GROUP inputs): scale
        and offset [out, inputs / INT4_GROUP] with weight = (q - 8) * scale + offset, when each of those groups lies
        in one stored group (contiguous groups of a multiple of INT4_GROUP)."""
        from runtime.native.models.cpu_weights import INT4_GROUP

        group = inputs // scales.shape[0]
        target = self.model.checkpoint_target(f"{module}.weight")
        linear_name = target[0].removesuffix(".weight") if target is not None else ""
        if (not isinstance(self._module(linear_name), Linear) or group % INT4_GROUP
                or group * scales.shape[0] != inputs or not torch.equal(groups, torch.arange(inputs) // group)):
            return  # (stacked MoE experts are parameters, not Linears)
        scale = scales.float().t().repeat_interleave(group // INT4_GROUP, dim=1)
        offset = ((8 - zeros).float().t() * scales.float().t()).repeat_interleave(group // INT4_GROUP, dim=1)
        self._grids.setdefault(linear_name, {})[target[1]] = (scale, offset)

    def _module(self, name: str) -> nn.Module | None:
        try:
            return self.model.get_submodule(name) if name else None
        except AttributeError:
            return None

    def _attach_grids(self) -> None:
        """Give each Linear whose every part was read with a grid its `int4_grid` (the parts in the Linear's order)."""
        for name, parts in self._grids.items():
            linear = self.model.get_submodule(name)
            order: tuple[str | None, ...] = (None,) if set(parts) == {None} else linear.part_names
            if set(parts) == set(order):
                linear.int4_grid = tuple(torch.cat([parts[p][i] for p in order]) for i in (0, 1))
        self._grids.clear()

    def finish(self) -> None:
        """After the last tensor: the log line (and an error naming projections missing packed tensors)."""
        if self._held:
            raise ValueError(f"INT4 weights missing packed tensors in the checkpoint: {', '.join(sorted(self._held))}")
        self._attach_grids()
        for name in self.kept:
            tile_int4(self.model.get_submodule(name))
        if self.kept:
            logger.info("%s INT4 checkpoint: %d projections kept in INT4 (Triton kernels)%s", self.method.upper(),
                        len(self.kept), f", {self.dequantized} dequantized to {self.dtype}" if self.dequantized else "")
        else:
            logger.info("%s INT4 checkpoint: %d projections dequantized to %s at load (INT4 kernels: --int4-kernels on "
                        "CUDA, without act-order)", self.method.upper(), self.dequantized, self.dtype)
